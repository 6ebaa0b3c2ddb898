"""bascule's gRPC server: HTTP/2 and gRPC's framing sans I/O in ``connection`` and ``messages``,
the asyncio shell in ``server``. Built because grpcio's server costs tens of microseconds per
message in Python, and python-hyper's h2 eleven per frame received (benchmarks/RESULTS.md)."""

from bascule.h2grpc.limits import GrpcLimits
from bascule.h2grpc.server import CallContext, Framed, GrpcServer, server_tls_context
from bascule.h2grpc.services import Method, service_methods
from bascule.h2grpc.status import Abort, Ended, Status

__all__ = [
    "Abort", "CallContext", "Ended", "Framed", "GrpcLimits", "GrpcServer", "Method", "Status", "server_tls_context",
    "service_methods",
]
