"""The one registry helper (lenpred.registry.registrar), as every registry uses it."""

import pytest

from lenpred.errors import LenpredError
from lenpred.registry import registrar


def test_registrar_adds_names_and_refuses_a_second_object_under_one_name():
    reg = {"placeholder": None}
    register = registrar(reg, "widget")

    @register("a")
    class A:
        pass

    def fill():
        pass

    assert A.name == "a" and reg == {"placeholder": None, "a": A}
    assert registrar(reg, "widget", name_attr=None)("placeholder")(fill) is fill and reg["placeholder"] is fill
    assert not hasattr(fill, "name")
    with pytest.raises(LenpredError, match="widget name 'a' is already registered by .*A: register .*B under another"):
        register("a")(type("B", (), {}))
    assert reg["a"] is A


def test_predictors_and_input_providers_refuse_a_duplicate_name():
    from lenpred.inputs import PROVIDERS, register_provider
    from lenpred.predictors.registry import PREDICTORS, Predictor, register

    last = PREDICTORS["last"]
    with pytest.raises(LenpredError, match="predictor name 'last' is already registered"):
        register("last")(type("Other", (Predictor,), {}))
    assert PREDICTORS["last"] is last and last.registry_name == "last"
    provider = PROVIDERS["signals"]
    with pytest.raises(LenpredError, match="input provider name 'signals' is already registered"):
        register_provider("signals")(lambda backbone, data, settings: {})
    assert PROVIDERS["signals"] is provider
