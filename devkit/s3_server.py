"""The local stack's S3 API: moto's S3 backend alone, served on loopback (scripts/stack.sh start_s3).

`moto_server` dispatches every request across all of moto's services, listing moto's package folders on each
one to find the service; a quarter of its CPU went there under the test suite. The stack needs S3 only, so this
serves moto's S3 application directly: the same backend, the same responses.

usage: python devkit/s3_server.py [-H HOST] [-p PORT]
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from moto.moto_server.werkzeug_app import create_backend_app
from moto.server import MotoRequestHandler
from werkzeug.serving import run_simple


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-H", "--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    parser.add_argument("-p", "--port", type=int, default=9000, help="port (default: %(default)s)")
    args = parser.parse_args(argv)
    os.environ.setdefault("MOTO_PORT", str(args.port))  # as moto_server sets it
    run_simple(args.host, args.port, create_backend_app("s3"), threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
