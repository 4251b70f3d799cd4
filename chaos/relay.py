"""A TCP relay from a worker's network namespace to services bound to 127.0.0.1.

``python -m chaos.relay LISTEN_HOST:PORT=TARGET_HOST:PORT ...`` forwards each listening
address to its target. PostgreSQL (and the receiver) listen on 127.0.0.1 only, which a
namespace cannot reach; the relay listens on the host end of the namespace's veth pair
instead, so the server's configuration stays as it is. Taking the veth link down then
cuts the worker off exactly as a partition would: its packets stop, and the server side
(the relay's connections to PostgreSQL) sees nothing until the link comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

BUFFER = 1 << 16


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(BUFFER):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


def _handler(host: str, port: int):  # type: ignore[no-untyped-def]
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    return handle


async def main(pairs: list[str]) -> None:
    """Relay each ``LISTEN=TARGET`` pair until killed."""
    servers = []
    for pair in pairs:
        listen, _, target = pair.partition("=")
        lhost, _, lport = listen.rpartition(":")
        thost, _, tport = target.rpartition(":")
        servers.append(await asyncio.start_server(_handler(thost, int(tport)), lhost, int(lport)))
    print("relay ready", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
