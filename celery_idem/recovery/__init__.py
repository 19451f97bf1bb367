"""Recovery: nothing lost and nothing stuck, whatever crashes (docs/how-to/recovery.md).

- ``sweep``: the periodic pass (``reap``) over stale claims and lost messages.
- ``handback``: the one rule for a claim that goes back (released, uncertain or
  dead-lettered), used by every path that hands one back.
- ``worker``: the worker's MainProcess hands back the claim of a lost pool child at once,
  and its own claims at shutdown.
- ``resend``: publish a stored job's message again.

The beat entry is ``celery_idem.beat.recovery_schedule``; the task it runs is
``celery_idem.tasks.release_stale_claims``.
"""

from __future__ import annotations

from .sweep import Report, reap

__all__ = ["Report", "reap"]
