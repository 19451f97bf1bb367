"""What the admin tells the operator after an action, per outcome, in the plural forms.

Each catalogue maps an outcome (``actions.Outcome`` value, or a finer name such as
``succeeded`` for a retry refused because the job already succeeded) to a message built
with ``ngettext_lazy`` and ``%(count)d`` / ``%(keys)s`` placeholders, and its level.
"""

from __future__ import annotations

from django.contrib import messages
from django.utils.translation import ngettext_lazy

RETRY = {
    "done": (ngettext_lazy(
        "%(count)d job is pending again and was sent to its queue: %(keys)s.",
        "%(count)d jobs are pending again and were sent to their queues: %(keys)s.",
        "count"), messages.SUCCESS),
    "succeeded": (ngettext_lazy(
        "%(count)d job was not retried because it already succeeded: %(keys)s. Its effect "
        "happened once, and running it again would repeat it, which is what its "
        "idempotency key prevents. To run the key again on purpose, forget the job first.",
        "%(count)d jobs were not retried because they already succeeded: %(keys)s. Their "
        "effects happened once, and running them again would repeat them, which is what "
        "their idempotency keys prevent. To run a key again on purpose, forget the job first.",
        "count"), messages.ERROR),
    "wrong_state": (ngettext_lazy(
        "%(count)d job was not retried because only failed or uncertain jobs can be: "
        "%(keys)s.",
        "%(count)d jobs were not retried because only failed or uncertain jobs can be: "
        "%(keys)s.",
        "count"), messages.WARNING),
    "not_stored": (ngettext_lazy(
        "%(count)d job was not retried because its arguments are not stored "
        "(CELERY_IDEM_STORE_ARGUMENTS is off): %(keys)s.",
        "%(count)d jobs were not retried because their arguments are not stored "
        "(CELERY_IDEM_STORE_ARGUMENTS is off): %(keys)s.",
        "count"), messages.ERROR),
}

SEND_NOW = {
    "done": (ngettext_lazy(
        "%(count)d pending job was sent to its queue again: %(keys)s.",
        "%(count)d pending jobs were sent to their queues again: %(keys)s.",
        "count"), messages.SUCCESS),
    "wrong_state": (ngettext_lazy(
        "%(count)d job was not sent because only pending jobs can be: %(keys)s.",
        "%(count)d jobs were not sent because only pending jobs can be: %(keys)s.",
        "count"), messages.WARNING),
    "not_stored": (ngettext_lazy(
        "%(count)d job was not sent because its arguments are not stored "
        "(CELERY_IDEM_STORE_ARGUMENTS is off): %(keys)s.",
        "%(count)d jobs were not sent because their arguments are not stored "
        "(CELERY_IDEM_STORE_ARGUMENTS is off): %(keys)s.",
        "count"), messages.ERROR),
    "scheduled": (ngettext_lazy(
        "%(count)d job was not sent because it waits for a retry scheduled for later; its "
        "message is due then: %(keys)s.",
        "%(count)d jobs were not sent because they wait for retries scheduled for later; "
        "their messages are due then: %(keys)s.",
        "count"), messages.WARNING),
    "expired": (ngettext_lazy(
        "%(count)d job was not sent because its message expired; recovery marks it "
        "expired, and Retry sends it again: %(keys)s.",
        "%(count)d jobs were not sent because their messages expired; recovery marks them "
        "expired, and Retry sends them again: %(keys)s.",
        "count"), messages.WARNING),
}

RELEASE = {
    "done": (ngettext_lazy(
        "%(count)d claim was released; the job is pending again and was sent to its "
        "queue: %(keys)s.",
        "%(count)d claims were released; the jobs are pending again and were sent to their "
        "queues: %(keys)s.",
        "count"), messages.SUCCESS),
    "done_kept": (ngettext_lazy(
        "%(count)d claim was released; the job is pending again and the reaper will send "
        "it: %(keys)s.",
        "%(count)d claims were released; the jobs are pending again and the reaper will "
        "send them: %(keys)s.",
        "count"), messages.SUCCESS),
    "wrong_state": (ngettext_lazy(
        "%(count)d job was not released because it is not running: %(keys)s.",
        "%(count)d jobs were not released because they are not running: %(keys)s.",
        "count"), messages.WARNING),
}

RESOLVE = {
    "done": (ngettext_lazy(
        "%(count)d uncertain job was marked succeeded: %(keys)s.",
        "%(count)d uncertain jobs were marked succeeded: %(keys)s.",
        "count"), messages.SUCCESS),
    "wrong_state": (ngettext_lazy(
        "%(count)d job was not resolved because it is not uncertain: %(keys)s.",
        "%(count)d jobs were not resolved because they are not uncertain: %(keys)s.",
        "count"), messages.WARNING),
}

FORGET = {
    "done": (ngettext_lazy(
        "%(count)d job was forgotten with its history; its key can run again: %(keys)s.",
        "%(count)d jobs were forgotten with their history; their keys can run again: "
        "%(keys)s.",
        "count"), messages.SUCCESS),
    "wrong_state": (ngettext_lazy(
        "%(count)d job was not forgotten because it is running; release its claim first: "
        "%(keys)s.",
        "%(count)d jobs were not forgotten because they are running; release their claims "
        "first: %(keys)s.",
        "count"), messages.WARNING),
}

#: Shared by every action: the job moved between the operator's look and the write.
RACED = (ngettext_lazy(
    "%(count)d job changed while you acted (another attempt or operator got there first) "
    "and was left as it is: %(keys)s. Reload to see its state.",
    "%(count)d jobs changed while you acted (another attempt or operator got there first) "
    "and were left as they are: %(keys)s. Reload to see their state.",
    "count"), messages.WARNING)

DISPATCH_FAILED = (ngettext_lazy(
    "%(count)d job is pending but could not be sent (%(error)s): %(keys)s. The reaper sends "
    "pending jobs again after CELERY_IDEM_DISPATCH_TIMEOUT.",
    "%(count)d jobs are pending but could not be sent (%(error)s): %(keys)s. The reaper "
    "sends pending jobs again after CELERY_IDEM_DISPATCH_TIMEOUT.",
    "count"), messages.WARNING)

TOO_MANY = (ngettext_lazy(
    "Select at most %(count)d job for this action.",
    "Select at most %(count)d jobs for this action.",
    "count"), messages.ERROR)
