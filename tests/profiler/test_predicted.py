"""The profiler's predicted column: the performance model's operator classes in the profiler's
categories, summing to the model's own step times."""

import pytest

from tacit.perf_model.model_shape import load_hf_config, shape_from_hf
from tacit.perf_model.operators import Parallel
from tacit.perf_model.predict import Workload, predict
from tacit.platforms.hardware_table import get_hardware_spec
from tacit.profiler.categories import CATEGORIES
from tacit.profiler.predicted import MODEL_CLASS_CATEGORY, predicted_categories, weight_dtype_of


def test_every_model_class_has_a_category():
    from tacit.perf_model.operators import OP_CLASSES

    assert set(MODEL_CLASS_CATEGORY) == set(OP_CLASSES)
    assert set(MODEL_CLASS_CATEGORY.values()) <= set(CATEGORIES)


@pytest.mark.parametrize("model", ["Qwen3-30B-A3B", "DeepSeek-V3", "Llama-3.1-8B"])
def test_categories_sum_to_the_models_step_times(model):
    hf = load_hf_config(model)
    layout = Parallel(8, shape_from_hf(hf).is_moe)  # expert parallel where there are experts
    got = predicted_categories(hf, 4, 256, 32, "bf16", "bf16", layout, "h200-sxm")
    want = predict(shape_from_hf(hf), get_hardware_spec("h200-sxm"), Workload(4, 256, 32, parallel=layout))
    assert sum(got["prefill"].values()) == pytest.approx(want.prefill_step_s)
    assert sum(got["decode"].values()) == pytest.approx(want.tpot_s)
    assert got["decode"]["communication"] > 0


def test_weight_dtype_is_the_nearest_bytes_per_value():
    from tacit.perf_model.memory import weight_bytes

    hf = load_hf_config("Llama-3.1-8B")
    values = weight_bytes(shape_from_hf(hf), Parallel(), "bf16") / 2
    assert weight_dtype_of(hf, int(2 * values), Parallel()) == "bf16"
    assert weight_dtype_of(hf, int(1.0625 * values), Parallel()) == "int8"
    assert weight_dtype_of(hf, int(0.7 * values), Parallel()) == "int4"  # a Q4_1 file with a Q8_0 head
