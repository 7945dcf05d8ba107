"""Under ``make test`` (``--dist loadgroup``) the groups of tests/conftest.py reach xdist's
scheduler: the stack tests share one stack, a module's fixture is made once. xdist reads a
group from a suffix it adds to the node id, and a pytest release that stops taking the
suffix (pytest 9.2 with xdist 3.8, pytest-xdist#1386) spreads the groups silently."""

import pytest


@pytest.fixture(scope="module")
def made_once() -> str:
    return "module fixture"


def test_a_module_sharing_a_fixture_is_one_group(made_once: str, request: pytest.FixtureRequest):
    # an xdist worker's own option (its ``dist`` reads "no": the controller distributes)
    if not request.config.getoption("loadgroup", False):
        pytest.skip("runs under --dist loadgroup (make test, make test-fast)")
    assert request.node.nodeid.endswith("@module-tests/test_xdist_groups.py"), (
        f"{request.node.nodeid}: xdist did not take the group; see pyproject.toml's pytest pin"
    )
