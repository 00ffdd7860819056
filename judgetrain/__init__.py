"""judgetrain: fine-tune LLM judges with DPO so they ignore surface form and catch real errors."""

__version__ = "0.1.0"
