"""MARFT compute engine: base models, LoRA adapters, sampling, log-probs, losses and optimizers."""

__version__ = "0.1.0"
