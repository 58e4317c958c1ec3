#!/usr/bin/env python3
"""A TCP proxy that delays every byte by a fixed time in each direction, as a network would.

    delay_proxy.py LISTEN_PORT TARGET_HOST TARGET_PORT DELAY_MS

Listens on 127.0.0.1:LISTEN_PORT and relays each connection to TARGET_HOST:TARGET_PORT; what
arrives from either side is written to the other DELAY_MS milliseconds later, in order. A round
trip through it therefore costs 2 x DELAY_MS more. Prints "ready" on stdout once it listens.
"""

import asyncio
import socket
import sys


async def relay(reader, writer, delay):
    """Copies reader to writer, each chunk written `delay` seconds after it arrived."""
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()

    async def send():
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(send())
    try:
        while True:
            data = await reader.read(65536)
            queue.put_nowait((loop.time() + delay, data))
            if not data:
                break
    except ConnectionError:
        queue.put_nowait((loop.time(), b""))
    try:
        await sender
    except ConnectionError:
        pass


async def main():
    listen, host, port, delay_ms = sys.argv[1:5]
    delay = float(delay_ms) / 1000.0

    async def accept(client_reader, client_writer):
        try:
            server_reader, server_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            client_writer.close()
            return
        for w in (client_writer, server_writer):
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(
            relay(client_reader, server_writer, delay),
            relay(server_reader, client_writer, delay),
        )

    server = await asyncio.start_server(accept, "127.0.0.1", int(listen))
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
