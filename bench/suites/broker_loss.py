"""Embedded broker: messages lost by kombu's filesystem transport against celery_idem's.

    python -m bench run broker-loss --n 3000 --rounds 5

Per round and transport, one process publishes N messages while another consumes them
with no polling delay (a busy worker). kombu's transport makes the ``.msg`` file visible
before writing into it, so the consumer sometimes takes an empty file, fails to decode
it, and the message is gone; ``celery_idem.filesystem`` renames a finished file into
place. Transports run interleaved, each round in a fresh folder. Needs no server.
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
from typing import Any

from bench.lib import common as c
from bench.lib.environment import environment
from bench.suites import Options, refuse

QUESTION = ("How many messages does kombu's filesystem transport lose, against "
            "celery_idem.filesystem?")
#: No database: the stack is not used.
STACKS = ("postgres", "pgbouncer", "mysql")


def arguments(o: Options) -> list[str]:
    for option, value in (("--variants", o.variants), ("--broker", o.broker)):
        refuse("broker-loss", option, value)
    return [*o.pick(o.n, 200, "--n"), *o.pick(o.rounds, 1, "--rounds")]


TRANSPORTS = {"kombu": "filesystem", "celery_idem": "celery_idem.filesystem:Transport"}
QUEUE = "loss"


def _connection(transport: str, folder: str) -> Any:
    from kombu import Connection

    options = {"data_folder_in": folder, "data_folder_out": folder, "polling_interval": 0}
    return Connection("filesystem://", transport=transport, transport_options=options)


def _produce(transport: str, folder: str, n: int) -> None:
    with _connection(transport, folder) as conn:
        queue = conn.SimpleQueue(QUEUE, serializer="json")
        for i in range(n):
            queue.put({"i": i, "pad": "x" * 1000})


def _consume(transport: str, folder: str, n: int, done: Any) -> None:
    received = undecodable = 0
    deadline = time.monotonic() + 120
    with _connection(transport, folder) as conn:
        queue = conn.SimpleQueue(QUEUE)
        while received + undecodable < n and time.monotonic() < deadline:
            try:
                message = queue.get(block=True, timeout=1)
            except queue.Empty:
                continue
            except ValueError:  # an empty or half-written file: the message is lost
                undecodable += 1
                continue
            message.ack()
            received += 1
    done.put((received, undecodable))


def one_round(transport: str, n: int) -> dict[str, int]:
    with tempfile.TemporaryDirectory(prefix="idem-fsloss-") as folder:
        done: multiprocessing.Queue = multiprocessing.Queue()
        consumer = multiprocessing.Process(target=_consume, args=(transport, folder, n, done))
        producer = multiprocessing.Process(target=_produce, args=(transport, folder, n))
        consumer.start()
        producer.start()
        producer.join()
        received, undecodable = done.get(timeout=180)
        consumer.join()
    return {"sent": n, "received": received, "undecodable": undecodable,
            "lost": n - received}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rounds: dict[str, list[dict[str, int]]] = {name: [] for name in TRANSPORTS}
    for r in range(args.rounds):
        for name, transport in TRANSPORTS.items():
            result = one_round(transport, args.n)
            rounds[name].append(result)
            c.log(f"round {r + 1} {name}: lost {result['lost']} of {args.n}")
    summary = {name: {"sent": sum(x["sent"] for x in rs), "lost": sum(x["lost"] for x in rs)}
               for name, rs in rounds.items()}
    c.write_result("filesystem_loss", {
        "benchmark": "filesystem_loss", "command": c.command_line(),
        "environment": environment(), "settings": vars(args), "rounds": rounds,
        "summary": summary, "loadavg_end": c.loadavg(),
    }, args.out)
    for name, s in summary.items():
        print(f"{name:>12}: lost {s['lost']} of {s['sent']} messages")
    return 0

