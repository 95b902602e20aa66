"""OpenTelemetry traces (`server.tracing`): one span per request, children for what it waited on and ran.

With `server.tracing: {otlp_endpoint, service_name, sample_ratio}` every request becomes a SERVER span
`<METHOD> <route template>`, continuing the client's W3C `traceparent`, with children `rsinfer.tokenize`,
`rsinfer.queue`, `rsinfer.forward` and `rsinfer.postprocess` built from the times the request recorded (the engine
knows no tracing: its queue stamps its wait and forwards into the request's record, engine/scheduler/). Spans go
through the official SDK's batch processor to the OTLP/HTTP protobuf exporter at `<otlp_endpoint>/v1/traces`.

Off by default, and then free: nothing here is imported. The SDK is the optional extra `rsinfer[otel]`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ..config import Config
from ..errors import ConfigError
from ..runtime.record import RequestRecord

# perf_counter → wall-clock nanoseconds (spans need epoch times; requests stamp perf_counter)
_OFFSET_NS = time.time_ns() - time.perf_counter_ns()


def _ns(perf: float) -> int:
    return _OFFSET_NS + int(perf * 1e9)


class Tracing:
    def __init__(self, config: Config) -> None:
        t = config.server.tracing
        assert t is not None
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
            from opentelemetry.trace import SpanKind, set_span_in_context
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            raise ConfigError(f"{config.file}: server.tracing needs the OpenTelemetry SDK: "
                              "pip install 'rsinfer[otel]'") from None
        self.provider = TracerProvider(resource=Resource.create({"service.name": t.service_name}),
                                       sampler=ParentBased(TraceIdRatioBased(t.sample_ratio)))
        endpoint = t.otlp_endpoint.rstrip("/") + "/v1/traces"
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        self.tracer = self.provider.get_tracer("rsinfer")
        self.propagator = TraceContextTextMapPropagator()
        self._server = SpanKind.SERVER
        self._in = set_span_in_context

    def request(self, headers: Mapping[str, str], name: str, start: float, end: float,
                attributes: dict[str, Any], stats: RequestRecord) -> None:
        """The request's span and its children, from perf_counter times."""
        parent = self.propagator.extract({k.lower(): v for k, v in headers.items() if k.lower() in
                                          ("traceparent", "tracestate")})
        span = self.tracer.start_span(name, context=parent, kind=self._server, start_time=_ns(start),
                                      attributes={k: v for k, v in attributes.items() if v is not None})
        if span.is_recording():
            inside = self._in(span)
            last = start
            for child in ("tokenize", "queue", "forward"):
                times = getattr(stats, f"t_{child}")
                if times and times[1] >= times[0]:
                    self.tracer.start_span(f"rsinfer.{child}", context=inside, start_time=_ns(times[0])) \
                        .end(end_time=_ns(times[1]))
                    last = max(last, times[1])
            if stats.t_forward or stats.t_tokenize:
                self.tracer.start_span("rsinfer.postprocess", context=inside, start_time=_ns(last)) \
                    .end(end_time=_ns(end))
        span.end(end_time=_ns(end))

    def close(self) -> None:
        self.provider.shutdown()     # the spans still batched are sent
