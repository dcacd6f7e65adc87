import pytest
from engine_harness import greedy as make_greedy


@pytest.fixture
def greedy():
    return make_greedy
