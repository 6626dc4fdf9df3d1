"""kztts.server.metrics: a server's Prometheus metrics in a registry of its own, the frames and tokens the scheduler
reports, and the recent generation rate ``GET /metrics`` shows."""
from __future__ import annotations

from kztts.server import metrics as server_metrics
from kztts.server.metrics import Metrics


def value(m: Metrics, name: str, **labels) -> float:
    return m.registry.get_sample_value(name, labels or None) or 0.0


def test_each_server_counts_in_its_own_registry():
    a, b = Metrics(), Metrics()
    a.produced(3)
    a.produced(2, "tokens")
    a.requests.labels("/v1/models", "200").inc()
    assert value(a, "kztts_frames_total") == 3 and value(a, "kztts_tokens_total") == 2
    assert value(a, "kztts_requests_total", endpoint="/v1/models", status="200") == 1
    assert value(b, "kztts_frames_total") == value(b, "kztts_tokens_total") == 0


def test_render_is_the_prometheus_text_without_created_series():
    m = Metrics()
    m.first_audio.observe(0.3)
    m.queue_depth.set(2)
    text = m.render().decode()
    for name in ("kztts_requests_total", "kztts_errors_total", "kztts_queue_depth 2.0", "kztts_running_streams",
                 "kztts_frames_total", "kztts_tokens_total", "kztts_audio_seconds_total", "kztts_cancelled_total",
                 "kztts_frames_per_second", 'kztts_time_to_first_audio_seconds_bucket{le="0.5"} 1.0',
                 "kztts_time_to_first_token_seconds_count", "kztts_request_seconds"):
        assert name in text, name
    assert "_created" not in text


def test_frames_per_second_is_measured_over_the_recent_window(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(server_metrics.time, "monotonic", lambda: now[0])
    m = Metrics(window=10.0)

    def fps() -> float:
        m.render()
        return value(m, "kztts_frames_per_second")

    assert fps() == 0.0
    m.produced(10)
    assert fps() == 10.0  # one step just now: over at least one second
    now[0] += 1.0
    m.produced(10)
    now[0] += 1.0
    assert fps() == 10.0  # 20 units over the 2 s since the first step
    now[0] += 20.0  # past the window: the steps are forgotten
    assert fps() == 0.0
    assert value(m, "kztts_frames_total") == 20  # the counter keeps them
