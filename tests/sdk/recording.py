"""What the SDK-driven scripts share (tests/openai/journey.py, tests/sdk/translation.py): a failed
check, and a transport that records every HTTP exchange the SDK makes. Stdlib and the SDKs'
transport layer only."""

try:  # the transport layer the SDKs run on: httpx2 from openai 3 / anthropic 2, httpx before
    import httpx2 as httpx
except ImportError:  # pragma: no cover - older SDKs
    import httpx


class Failure(Exception):
    """A check that did not hold."""


def check(condition, what, seen=None):
    if not condition:
        raise Failure(what if seen is None else f"{what}: got {seen!r}")


class RecordingTransport(httpx.BaseTransport):
    """Passes every request to the real transport and keeps a copy of each exchange, the
    response body as far as the client read it."""

    def __init__(self):
        self.inner = httpx.HTTPTransport()
        self.exchanges = []

    def handle_request(self, request):
        response = self.inner.handle_request(request)
        record = {
            "method": request.method,
            "path": request.url.raw_path.decode("ascii", "replace"),
            "request_headers": [[k, v] for k, v in request.headers.multi_items()],
            "status": response.status_code,
            "headers": [[k, v] for k, v in response.headers.multi_items()],
            "body": bytearray(),
        }
        self.exchanges.append(record)
        inner_stream = response.stream

        class Tee(httpx.SyncByteStream):
            def __iter__(self):
                for chunk in inner_stream:
                    record["body"] += chunk
                    yield chunk

            def close(self):
                inner_stream.close()

        response.stream = Tee()
        return response

    def close(self):
        self.inner.close()

    def last(self, step):
        """The last exchange of `step` (its `x-run-id`)."""
        for exchange in reversed(self.exchanges):
            if dict((k.lower(), v) for k, v in exchange["request_headers"]).get("x-run-id") == step:
                return exchange
        raise Failure(f"{step}: no exchange recorded")

    def report(self):
        return [
            dict(e, body=bytes(e["body"]).decode("utf-8", "replace")) for e in self.exchanges
        ]
