"""Registry: every seam registers implementations by name the same way."""

import pytest

from tacit.registry import Registry


def test_register_lookup_and_errors_name_the_choices():
    reg = Registry("widget")

    @reg.register("a")
    class A:
        pass

    @reg.register("b")
    class B:
        pass

    assert reg.lookup("a") is A and A.name == "a" and list(reg) == ["a", "b"]
    with pytest.raises(ValueError, match=r"widget='c' is not known; valid: a, b"):
        reg.lookup("c")
    with pytest.raises(ValueError, match="widget 'a' is registered twice"):
        reg.register("a")(type("Other", (), {}))
    assert reg.lookup("a") is A  # the first registration stands
