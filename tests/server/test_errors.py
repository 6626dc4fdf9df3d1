"""kztts.server.errors: a refusal as OpenAI's API words it, ``{"error": {message, type, param, code}}``, its type
from its status."""
from __future__ import annotations

import pytest

from kztts.server.errors import ApiError, bad, error_body


@pytest.mark.parametrize("status, kind", [
    (400, "invalid_request_error"), (401, "invalid_request_error"), (404, "invalid_request_error"),
    (405, "invalid_request_error"), (413, "invalid_request_error"), (429, "rate_limit_error"),
    (500, "server_error"), (503, "service_unavailable"),
    (418, "invalid_request_error"), (502, "server_error"),  # statuses OpenAI does not list: by their class
])
def test_the_error_type_follows_the_status(status, kind):
    assert error_body(status, "why")["error"]["type"] == kind


def test_an_api_error_is_its_status_body_and_headers():
    headers = {"Retry-After": "3"}
    error = ApiError(429, "the server is busy", param="input", code="queue_full", headers=headers)
    headers["Retry-After"] = "99"  # the error keeps its own copy
    assert (error.status, error.message, str(error), error.headers) == (429, "the server is busy",
                                                                        "the server is busy", {"Retry-After": "3"})
    assert error.body() == {"error": {"message": "the server is busy", "type": "rate_limit_error", "param": "input",
                                      "code": "queue_full"}}
    assert ApiError("404", "gone").status == 404 and ApiError(404, "gone").headers == {}
    assert ApiError(404, "gone").body()["error"] == {"message": "gone", "type": "invalid_request_error", "param": None,
                                                     "code": None}


def test_bad_is_a_400_naming_the_key():
    error = bad("'seed' must be an integer", param="seed")
    assert isinstance(error, ApiError) and error.status == 400
    assert error.body()["error"] == {"message": "'seed' must be an integer", "type": "invalid_request_error",
                                     "param": "seed", "code": "invalid_value"}
    assert bad("no JSON", code="invalid_json").code == "invalid_json"
