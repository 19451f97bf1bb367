"""The embedded broker: a consumer never sees a message before it is whole."""

from __future__ import annotations

import os

import pytest
from celery import Celery
from kombu import Connection
from kombu.exceptions import ChannelError
from kombu.transport.virtual import BrokerState

from celery_idem import filesystem

TRANSPORT = "celery_idem.filesystem:Transport"


@pytest.fixture(autouse=True)
def _fresh_broker_state(monkeypatch):
    # kombu's filesystem transport remembers declared bindings per process, and writes a
    # binding into the control folder only the first time: each test has its own folder.
    monkeypatch.setattr(filesystem.Transport, "global_state", BrokerState())


def connect(folder) -> Connection:
    # The transport creates its processed and control folders: beside the queue folder,
    # which the tests list.
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder),
               "processed_folder": f"{folder}-processed",
               "control_folder": f"{folder}-control", "polling_interval": 0}
    return Connection("filesystem://", transport=TRANSPORT, transport_options=options)


def test_celery_setting_selects_the_atomic_transport(tmp_path):
    app = Celery(set_as_current=False)
    app.conf.broker_url = "filesystem://"
    app.conf.broker_transport = TRANSPORT
    app.conf.broker_transport_options = {"data_folder_in": str(tmp_path),
                                         "data_folder_out": str(tmp_path),
                                         "processed_folder": str(tmp_path / "processed"),
                                         "control_folder": str(tmp_path / "control")}
    with app.connection_for_write() as conn:
        assert isinstance(conn.transport, filesystem.Transport)


def test_a_message_is_invisible_until_it_is_whole(tmp_path, monkeypatch):
    """A consumer polling between the write and the rename finds nothing, not a torn file."""
    seen_mid_publish = []
    real_replace = os.replace

    with connect(tmp_path) as producer_conn, connect(tmp_path) as consumer_conn:
        consumer = consumer_conn.SimpleQueue("jobs")

        def replace_after_a_poll(src, dst):
            with pytest.raises(consumer.Empty):
                consumer.get(block=False)
            seen_mid_publish.append(sorted(os.listdir(tmp_path)))
            real_replace(src, dst)

        producer = producer_conn.SimpleQueue("jobs", serializer="json")
        monkeypatch.setattr(filesystem.os, "replace", replace_after_a_poll)
        producer.put({"order": 42, "pad": "x" * 100_000})
        monkeypatch.undo()

        message = consumer.get(block=False)
        assert message.payload == {"order": 42, "pad": "x" * 100_000}
        message.ack()
    assert len(seen_mid_publish) == 1
    assert [name.endswith(filesystem.PARTIAL_SUFFIX) for name in seen_mid_publish[0]] == [True]
    assert os.listdir(tmp_path) == []


def test_every_message_arrives_once(tmp_path):
    # Like kombu's own, the names order messages by millisecond only, so no FIFO claim.
    with connect(tmp_path) as conn:
        queue = conn.SimpleQueue("jobs", serializer="json")
        for n in range(20):
            queue.put({"n": n})
        received = []
        for _ in range(20):
            message = queue.get(block=False)
            received.append(message.payload["n"])
            message.ack()
        with pytest.raises(queue.Empty):
            queue.get(block=False)
    assert sorted(received) == list(range(20))


def test_a_failed_publish_raises_and_leaves_no_partial_file(tmp_path, monkeypatch):
    def refuse(src, dst):
        raise OSError("disk full")

    with connect(tmp_path) as conn:
        queue = conn.SimpleQueue("jobs", serializer="json")
        monkeypatch.setattr(filesystem.os, "replace", refuse)
        with pytest.raises(ChannelError):
            queue.put({"n": 1})
    assert os.listdir(tmp_path) == []


def test_the_transport_creates_its_missing_folders(tmp_path):
    """No folder exists yet: the first channel makes them all, and a message goes through."""
    base = tmp_path / "broker"
    with connect(base / "queue") as conn:
        queue = conn.SimpleQueue("jobs", serializer="json")
        queue.put({"order": 1})
        assert queue.get(timeout=5).payload == {"order": 1}
        queue.close()
    assert sorted(p.name for p in base.iterdir()) == [
        "queue", "queue-control", "queue-processed"]
