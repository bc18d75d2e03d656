"""Embedded Triton side: model preparation and a launcher for the real tritonserver binary."""
