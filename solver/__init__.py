"""parplan: a planner for distributed training and serving of large transformers."""

__version__ = "0.1.0"
