#!/usr/bin/env python3
"""An open-loop HTTP load: requests sent on a fixed schedule whatever the server answers, one
connection each (httperf's --rate, the XenMon paper's load). wrk is closed-loop: a slow server
slows its requests down, so it never offers more than the server takes.

    python3 openloop.py --rate R --seconds S [--timeout T] [--max-open N] URL

    --rate R      requests per second, sent on the schedule k/R (k = 0, 1, ...)
    --seconds S   how long requests are sent (R × S of them)
    --timeout T   a reply later than T seconds after its request was due is a timeout (default 5)
    --max-open N  requests in flight at most; one due beyond them is not sent and is counted
                  (httperf's fd-unavail; default 1000)

Prints one line, read by run.sh and the XenMon study's table:

    WG-RESULT name=web seconds=S ops=REPLIES unit=requests offered_per_s=R sent=N
              replies=M errors=E timeouts=T unsent=U late=L latency_avg_us=A latency_p99_us=P

ops counts replies with a 2xx status; errors are refused or broken connections and other
statuses. Latency runs from when a request was due, not from when it went out, so a client
that falls behind does not hide the delay. late counts requests sent more than 10 ms after
they were due: when it is above 1 % of them this client, not the server, set the pace, and
it says so on stderr. Exits 0 when it ran, 2 on bad usage, 1 when the result could not be
written, 130 when interrupted (no result line).
"""

import argparse
import asyncio
import sys
import urllib.parse

# A request sent later than this after it was due counts as late (the client's own lag).
LATE_S = 0.010


class Tally:
    def __init__(self):
        self.sent = self.replies = self.errors = self.timeouts = self.unsent = self.late = 0
        self.latencies = []
        self.open = 0


def usage(why):
    print(f"openloop.py: {why}", file=sys.stderr)
    sys.exit(2)


def parse_args():
    parser = argparse.ArgumentParser(description="An open-loop HTTP load (fixed request rate).")
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--max-open", type=int, default=1000)
    parser.add_argument("url")
    args = parser.parse_args()
    if not 0 < args.rate <= 1_000_000:
        usage(f"--rate takes requests per second above 0 (at most 1000000), not {args.rate}")
    if not 0 < args.seconds <= 86_400:
        usage(f"--seconds takes a time above 0 (at most a day), not {args.seconds}")
    if not 0 < args.timeout <= 3_600:
        usage(f"--timeout takes seconds above 0 (at most an hour), not {args.timeout}")
    if args.max_open < 1:
        usage(f"--max-open takes a count above 0, not {args.max_open}")
    url = urllib.parse.urlsplit(args.url)
    if url.scheme != "http" or not url.hostname:
        usage(f"{args.url!r} is not an http:// URL (http://HOST:PORT/PATH)")
    return args, url


async def one_request(url, due, timeout, tally, loop):
    """Send one GET on a connection of its own; count what came of it."""
    request = (f"GET {url.path or '/'} HTTP/1.1\r\nHost: {url.netloc}\r\n"
               "Connection: close\r\nUser-Agent: virtprof-openloop\r\n\r\n").encode()
    writer = None
    try:
        async with asyncio.timeout_at(due + timeout):
            reader, writer = await asyncio.open_connection(url.hostname, url.port or 80)
            writer.write(request)
            await writer.drain()
            status_line = await reader.readline()
            # The whole reply: the server closes the connection after it.
            while await reader.read(65536):
                pass
        parts = status_line.split()
        if len(parts) >= 2 and parts[1].startswith(b"2"):
            tally.replies += 1
            tally.latencies.append(loop.time() - due)
        else:
            tally.errors += 1
    except TimeoutError:
        tally.timeouts += 1
    except OSError:
        tally.errors += 1
    finally:
        tally.open -= 1
        if writer is not None:
            writer.close()


async def offer(args, url):
    loop = asyncio.get_running_loop()
    tally = Tally()
    total = max(1, round(args.rate * args.seconds))
    tasks = set()
    start = loop.time() + 0.05
    k = 0
    while k < total:
        now = loop.time()
        # Every request due by now goes out now (a sleep is never exactly one period).
        while k < total and start + k / args.rate <= now:
            due = start + k / args.rate
            k += 1
            if tally.open >= args.max_open:
                tally.unsent += 1
                continue
            if now - due > LATE_S:
                tally.late += 1
            tally.sent += 1
            tally.open += 1
            task = asyncio.create_task(one_request(url, due, args.timeout, tally, loop))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if k < total:
            await asyncio.sleep(max(0.0, start + k / args.rate - loop.time()))
    # Each request ends by its own deadline: this wait is bounded by the timeout.
    if tasks:
        await asyncio.wait(set(tasks))
    return tally


def percentile(sorted_values, q):
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def main():
    args, url = parse_args()
    if sys.version_info < (3, 11):
        usage("needs Python 3.11 or later (asyncio.timeout_at)")
    try:
        tally = asyncio.run(offer(args, url))
    except KeyboardInterrupt:
        # A load cut short has no result to give: said, not a partial line read as a whole one.
        print("openloop.py: interrupted; no result", file=sys.stderr)
        return 130
    latencies = sorted(tally.latencies)
    average = f"{1e6 * sum(latencies) / len(latencies):.1f}" if latencies else "unknown"
    p99 = f"{1e6 * percentile(latencies, 0.99):.1f}" if latencies else "unknown"
    try:
        print(f"WG-RESULT name=web seconds={args.seconds:.2f} ops={tally.replies} unit=requests "
              f"offered_per_s={args.rate:g} sent={tally.sent} replies={tally.replies} errors={tally.errors} "
              f"timeouts={tally.timeouts} unsent={tally.unsent} late={tally.late} "
              f"latency_avg_us={average} latency_p99_us={p99}", flush=True)
    except OSError as e:
        # A closed pipe or a full disk: the result is lost, and said so.
        print(f"openloop.py: could not write the result: {e.strerror}", file=sys.stderr)
        return 1
    if tally.late > 0.01 * max(1, tally.sent):
        print(f"openloop.py: {tally.late} of {tally.sent} requests went out over {LATE_S * 1000:.0f} ms "
              f"late: this client could not offer {args.rate:g}/s here, so it set the pace",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
