"""`GET /`: a browser is sent on to the dashboard (and from there to its sign-in), an API client
gets where things are; unknown paths stay the contract's JSON 404 for everyone."""

from __future__ import annotations

from starlette.testclient import TestClient

BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


def test_a_browser_at_the_root_lands_on_the_dashboard_sign_in(client: TestClient) -> None:
    r = client.get("/", headers={"Accept": BROWSER}, follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, "/dashboard")
    r = client.get("/", headers={"Accept": BROWSER})
    assert r.status_code == 200 and r.url.path == "/dashboard/login"
    assert r.headers["content-type"].startswith("text/html") and "Account token" in r.text


def test_an_api_client_at_the_root_gets_where_things_are(client: TestClient) -> None:
    for accept in ("*/*", "application/json", None):
        headers = {"Accept": accept} if accept else {}
        r = client.get("/", headers=headers, follow_redirects=False)
        assert r.status_code == 200, accept
        assert r.json()["data"] == {
            "service": "tally",
            "dashboard": "http://testserver/dashboard",
            "api_reference": "http://testserver/docs",
            "openapi": "http://testserver/openapi.json",
            "error_codes": "http://testserver/docs/errors",
            "health": "http://testserver/healthz",
        }
        assert r.headers["x-request-id"]


def test_unknown_paths_are_still_json_404s_for_browsers_and_clients(client: TestClient) -> None:
    for path in ("/api/v1/nope", "/nope", "/api/v1/programs/x/nope"):
        for accept in (BROWSER, "*/*"):
            r = client.get(path, headers={"Accept": accept}, follow_redirects=False)
            assert r.status_code == 404, (path, accept)
            error = r.json()["error"]
            assert error["code"] == "not_found" and error["doc_url"].endswith("/docs/errors#not_found")
