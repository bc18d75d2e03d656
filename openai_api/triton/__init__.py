"""Triton adapters: one per wire protocol, over a shared pool of clients. Nothing above this package
imports tritonclient."""
