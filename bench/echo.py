"""A bare ROUTER echo server: the raw ZeroMQ round trip the stack is compared with."""

import sys

import zmq


def main(endpoint: str) -> None:
    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.linger = 0
    s.bind(endpoint)
    while True:
        frames = s.recv_multipart(copy=False)
        if frames[-1].bytes == b"quit":
            break
        s.send_multipart(frames, copy=False)
    s.close()
    ctx.term()


if __name__ == "__main__":
    main(sys.argv[1])
