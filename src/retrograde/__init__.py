"""retrograde: checkpointed differentiation of long time-stepping loops."""

from . import schedules

__version__ = "0.1.0"
__all__ = ["schedules"]
