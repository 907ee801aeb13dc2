"""The URL and port helpers that the spec, the command lines and the demo share."""

from __future__ import annotations

import socket

import pytest

from crossover.netutil import check_http_url, free_port, free_ports, port_free, spec_on_free_ports
from crossover.spec import load_spec
from tests.helpers import SPECS


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "https://prometheus:9090/", " http://h "])
def test_plain_http_urls_pass_without_their_trailing_slash(url: str) -> None:
    assert check_http_url(url) == url.strip().rstrip("/")


@pytest.mark.parametrize(("url", "why"), [
    ("notaurl", "want http://host:port"), ("ftp://prometheus:9090", "want http://host:port"),
    ("http://:9090", "want http://host:port"), ("localhost:9090", "want http://host:port"),
    ("http://p:0", "bad port"), ("http://p:abc", "bad port"), ("http://127.0.0.1:99999", "bad port")])
def test_a_bad_url_says_what_is_wrong(url: str, why: str) -> None:
    with pytest.raises(ValueError) as caught:
        check_http_url(url)
    assert str(caught.value) == f"malformed URL {url!r} ({why})"


def test_port_free_is_false_while_something_listens() -> None:
    port = free_port()
    assert port_free(port)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        assert not port_free(port)


def test_a_spec_moves_to_distinct_free_ports() -> None:
    # free_port releases its port at once, so two calls may get the same one; a spec's ports are
    # picked while all of them are held
    assert len(set(free_ports(200))) == 200
    spec = spec_on_free_ports(load_spec(SPECS / "pd-8k-prompts.yaml"))
    urls = [i.url for t in spec.topologies for i in t.instances] + [t.entrypoint.url for t in spec.topologies
                                                                    if t.entrypoint.url]
    assert len(set(urls)) == len(urls) == 5 and all(port_free(int(u.rsplit(":", 1)[1])) for u in urls)
