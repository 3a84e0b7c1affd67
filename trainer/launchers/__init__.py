"""Thin launchers: each starts the one training core (trainer.core.train) its own way."""
