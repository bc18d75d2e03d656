"""OpenAI-compatible gateway in front of NVIDIA Triton Inference Server."""

__version__ = "0.1.0"
