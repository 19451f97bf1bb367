"""An e-mail backend that records each message in the database instead of sending it.

Like an SMTP server, it keeps what it was given, at once and for good: a worker killed
after ``send()`` and before its job commits has sent the message, and the next attempt
sends it again. The demo counts those repeats (shop.SentEmail)."""

from django.core.mail.backends.base import BaseEmailBackend


class RecordingBackend(BaseEmailBackend):
    def send_messages(self, email_messages):  # type: ignore[no-untyped-def]
        from .models import SentEmail

        for message in email_messages:
            headers = message.extra_headers
            SentEmail.objects.create(
                to=", ".join(message.to), subject=message.subject, body=message.body,
                key=headers.get("X-Idempotency-Key", ""),
                attempt=int(headers.get("X-Attempt", 0)), worker=headers.get("X-Worker", ""))
        return len(email_messages)
