"""offrl: offline and model-based RL for continuous control."""

__version__ = "0.1.0"
