"""Issue 33: whatever a sample writes costs the grader's process at most about 1 s of CPU.

A report of about 1 MB can be made expensive to decode or to judge: integers whose hashes
collide (hash(k * (2**61 - 1)) == 0 for every k) turn each set or dict insertion into a
walk over all earlier ones, and one such report took 45 s of the trainer's CPU. The sample
writes its payload as JSON text through the harness's own encoder and JSON writer,
swapped (or returns a plain list for a test that makes a set of it), so the payload is
the same wherever the grader decodes. Each must score 0 quickly, with the grader's own
CPU (this process: the environment's threads run here) under 1 s.
"""

import resource
import time

import pytest
from sandbox_attacks import reward_of

from nemo_rl_core.environments.utils import create_env

# ~0.9 MB as JSON, under the 1 MB output limit
COLLIDING = "M = 2 ** 61 - 1\nINTS = ','.join(str(k * M) for k in range(1, 40_000))\n"
# The sample's value becomes a marker, and the marker's JSON becomes the payload's text,
# wherever a module of the harness holds the encoder and the JSON writer.
SWAP_ENCODER = """
import sys
def _marker(value, depth=0):
    return "@payload@"
def _swap(dump_json):
    return lambda data: dump_json(data).replace('"@payload@"', PAYLOAD)
for _module in list(sys.modules.values()):
    if hasattr(_module, "encode_plain") and hasattr(_module, "dump_json"):
        _module.encode_plain, _module.dump_json = _marker, _swap(_module.dump_json)
def f(x):
    return 0
"""

# What each payload's failure says: it reached the judge and was cut off there.
OVER_BUDGET = "judging took over 1s of CPU"
PAYLOADS = {
    "a set of colliding ints": (
        ["assert f(1) == {1}"],
        COLLIDING + "PAYLOAD = '{\"set\": [' + INTS + ']}'" + SWAP_ENCODER,
        OVER_BUDGET,
    ),
    "a dict keyed by colliding ints": (
        ["assert f(1) == {1: 0}"],
        COLLIDING
        + "PAYLOAD = '{\"dict\": [' + ','.join(f'[{i}, 0]' for i in INTS.split(',')[:33_000]) + ']}'"
        + SWAP_ENCODER,
        OVER_BUDGET,
    ),
    "a frozenset of colliding tuples": (
        ["assert f(1) == frozenset()"],
        COLLIDING + "PAYLOAD = '{\"frozenset\": [' + ','.join('{\"tuple\": [%s]}' % i for i in "
        "INTS.split(',')[:25_000]) + ']}'" + SWAP_ENCODER,
        OVER_BUDGET,
    ),
    "a plain list that the test turns into a set": (
        ["assert set(f(1)) == {1, 2}"],
        COLLIDING + "def f(x):\n    return [int(i) for i in INTS.split(',')]",
        OVER_BUDGET,
    ),
    "nesting far past the recursion limit": (
        ["assert f(1) == [1]"],
        "PAYLOAD = '{\"list\": [' * 60_000 + ']}' * 60_000" + SWAP_ENCODER,
        "maximum recursion depth exceeded",
    ),
    "an integer of 900,000 digits": (
        ["assert f(1) == 1"],
        "PAYLOAD = '9' * 900_000" + SWAP_ENCODER,
        "Exceeds the limit (4300 digits)",
    ),
}


@pytest.fixture(scope="module")
def full_output_env():
    """The environment with its default 1 MB output limit: room for the payloads."""
    environment = create_env("code", {"num_workers": 2, "wall_time_limit_s": 10})
    yield environment
    environment.shutdown()


@pytest.mark.parametrize("payload", PAYLOADS)
def test_a_costly_report_costs_the_grader_under_a_second(full_output_env, payload):
    tests, code, cut_off = PAYLOADS[payload]
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    reward, reason = reward_of(full_output_env, code, [{"assert": test} for test in tests])
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    assert reward == 0.0 and cut_off in reason, (payload, reason)
    assert cpu < 1.0, (payload, f"{cpu:.1f} s of the grader's CPU", reason)
    assert time.monotonic() - start < 30, (payload, reason)
