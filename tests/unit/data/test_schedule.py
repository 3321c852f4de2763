"""Class-incremental schedule: loss-of-plasticity semantics and class-order validation."""

from __future__ import annotations

import numpy as np
import pytest

from epochlens.errors import ClassOrderError, ConfigError, EpochlensError
from epochlens.schedule import (
    ClassSchedule,
    check_permutation,
    load_class_order,
    make_class_order,
    task_at_epoch,
)

# A fixed, non-trivial class order (the identity would hide index/value mix-ups).
ORDER_100 = np.random.default_rng(1234).permutation(100)


@pytest.fixture
def lop() -> ClassSchedule:
    """The loss-of-plasticity incremental CIFAR-100 schedule: 5 classes, +5 every 200 epochs."""
    return ClassSchedule(ORDER_100, initial_classes=5, increment=5, epochs_per_task=200)


# ---------------------------------------------------------------- LoP semantics


@pytest.mark.parametrize(
    ("epoch", "expected"),
    [
        (0, 5),  # untrained model, first task's classes
        (1, 5),
        (199, 5),
        (200, 5),  # boundary: trained on task 0, written before the classes are extended
        (201, 10),
        (399, 10),
        (400, 10),
        (3800, 95),
        (3801, 100),
        (4000, 100),
    ],
)
def test_num_active_follows_lop_checkpoint_semantics(lop, epoch, expected):
    assert lop.num_active(epoch) == expected


def test_lop_schedule_shape(lop):
    assert lop.num_classes == 100
    assert lop.num_tasks == 20
    assert lop.final_epoch == 4000
    # Beyond the last checkpoint the count saturates at the number of classes.
    assert lop.num_active(10_000) == 100


def test_num_active_rejects_negative_epoch(lop):
    with pytest.raises(ValueError, match="-1"):
        lop.num_active(-1)


def test_num_active_accepts_numpy_integers(lop):
    assert lop.num_active(np.int64(201)) == 10


def test_checkpoint_epochs_are_the_task_boundaries(lop):
    epochs = lop.checkpoint_epochs()
    assert epochs == list(range(0, 4001, 200))
    assert len(epochs) == 21
    assert epochs[0] == 0 and epochs[-1] == 4000


def test_checkpoint_epochs_save_every_adds_mid_task_epochs(lop):
    epochs = lop.checkpoint_epochs(save_every=100)
    assert epochs == list(range(0, 4001, 100))
    assert len(epochs) == 41
    assert 100 in epochs and 3900 in epochs
    # A step that does not divide the task length keeps every boundary as well.
    epochs = lop.checkpoint_epochs(save_every=300)
    assert epochs == sorted(set(range(0, 4001, 200)) | set(range(0, 4001, 300)))
    assert {200, 300, 400, 600, 3900, 4000} <= set(epochs)
    assert epochs == sorted(set(epochs))  # sorted, no duplicates


def test_active_classes_is_a_prefix_of_the_class_order(lop):
    np.testing.assert_array_equal(lop.active_classes(0), ORDER_100[:5])
    np.testing.assert_array_equal(lop.active_classes(200), ORDER_100[:5])
    np.testing.assert_array_equal(lop.active_classes(201), ORDER_100[:10])
    np.testing.assert_array_equal(lop.active_classes(3800), ORDER_100[:95])
    np.testing.assert_array_equal(lop.active_classes(4000), ORDER_100)
    assert lop.active_classes(0).dtype == np.int64


def test_active_classes_returns_a_copy(lop):
    active = lop.active_classes(0)
    active[:] = -1
    np.testing.assert_array_equal(lop.active_classes(0), ORDER_100[:5])


def test_class_order_is_stored_as_int64():
    s = ClassSchedule(np.array([2, 0, 1], dtype=np.int32), 1, 1, 10)
    assert s.class_order.dtype == np.int64
    np.testing.assert_array_equal(s.class_order, [2, 0, 1])


def test_task_of_class(lop):
    task = lop.task_of_class()
    assert task.dtype == np.int64 and task.shape == (100,)
    # The class introduced p-th belongs to task p // 5.
    np.testing.assert_array_equal(task[ORDER_100], np.arange(100) // 5)
    # Consistent with active_classes: at the end of task t exactly the classes of tasks 0..t.
    for t in range(lop.num_tasks):
        end = lop.task_epochs(t)[1]
        assert set(lop.active_classes(end).tolist()) == set(np.flatnonzero(task <= t).tolist())


def test_task_epochs(lop):
    assert lop.task_epochs(0) == (0, 200)
    assert lop.task_epochs(19) == (3800, 4000)


def test_task_at_epoch_scalar_and_array():
    assert int(task_at_epoch(0, 200)) == 0
    assert int(task_at_epoch(200, 200)) == 0
    assert int(task_at_epoch(201, 200)) == 1
    np.testing.assert_array_equal(
        task_at_epoch(np.array([0, 1, 200, 201, 400, 401]), 200), [0, 0, 0, 1, 1, 2]
    )


# ---------------------------------------------------------------- other schedules


def test_increment_that_does_not_divide_the_classes():
    order = np.array([3, 7, 1, 0, 9, 2, 8, 5, 4, 6])
    s = ClassSchedule(order, initial_classes=3, increment=4, epochs_per_task=10)
    assert s.num_tasks == 3  # 3, then 7, then 11 clipped to 10
    assert s.final_epoch == 30
    assert [s.num_active(e) for e in (0, 10, 11, 20, 21, 30, 99)] == [3, 3, 7, 7, 10, 10, 10]
    np.testing.assert_array_equal(s.active_classes(30), order)
    np.testing.assert_array_equal(s.task_of_class()[order], [0, 0, 0, 1, 1, 1, 1, 2, 2, 2])
    assert s.checkpoint_epochs() == [0, 10, 20, 30]


def test_all_classes_from_the_start_is_one_task():
    s = ClassSchedule(np.arange(4), initial_classes=4, increment=2, epochs_per_task=7)
    assert s.num_tasks == 1
    assert s.final_epoch == 7
    assert s.checkpoint_epochs() == [0, 7]
    assert s.num_active(7) == 4
    np.testing.assert_array_equal(s.task_of_class(), [0, 0, 0, 0])


def test_zero_increment_keeps_the_initial_classes():
    s = ClassSchedule(np.arange(6), initial_classes=2, increment=0, epochs_per_task=5)
    assert s.num_tasks == 1
    assert s.final_epoch == 5
    assert [s.num_active(e) for e in (0, 5, 6, 100)] == [2, 2, 2, 2]


@pytest.mark.parametrize(
    ("initial", "increment", "epochs_per_task", "match"),
    [
        (0, 5, 200, "initial_classes=0"),
        (11, 5, 200, "initial_classes=11"),
        (-1, 5, 200, "initial_classes=-1"),
        (5, -1, 200, "increment=-1"),
        (5, 5, 0, "epochs_per_task=0"),
        (5, 5, -200, "epochs_per_task=-200"),
    ],
)
def test_invalid_schedule_raises_config_error(initial, increment, epochs_per_task, match):
    with pytest.raises(ConfigError, match=match):
        ClassSchedule(np.arange(10), initial, increment, epochs_per_task)


@pytest.mark.parametrize(
    "order",
    [
        np.array([0, 1, 1, 3]),  # duplicate
        np.array([0, 1, 2, 4]),  # out of range
        np.array([0.0, 1.0, 2.0, 3.0]),  # float
        np.array([True, False]),  # bool is not an integer class id
        np.array([[0, 1], [2, 3]]),  # 2-D
        np.array(3),  # 0-d
        np.array(["0", "1", "2"]),  # strings
    ],
)
def test_invalid_class_order_in_schedule_raises_class_order_error(order):
    with pytest.raises(ClassOrderError, match="class_order"):
        ClassSchedule(order, 1, 1, 10)


def test_empty_class_order_raises_config_error():
    with pytest.raises(ConfigError, match="initial_classes"):
        ClassSchedule(np.array([], dtype=np.int64), 1, 1, 10)


# ---------------------------------------------------------------- class-order files


def test_errors_share_a_base_class():
    for cls in (ClassOrderError, ConfigError):
        assert issubclass(cls, EpochlensError)
    assert issubclass(EpochlensError, RuntimeError)


def test_check_permutation_reports_missing_and_repeated():
    with pytest.raises(ClassOrderError) as err:
        check_permutation(np.array([0, 2, 2, 3, 3]), 5, source="orders/index-0.npy")
    msg = str(err.value)
    assert msg.startswith("orders/index-0.npy: ")
    assert "missing [1, 4]" in msg and "repeated [2, 3]" in msg


def test_check_permutation_accepts_any_integer_dtype():
    for dtype in (np.int8, np.uint16, np.int32, np.int64):
        check_permutation(np.array([2, 0, 1], dtype=dtype), 3, source="x")


def test_make_class_order_is_a_seeded_permutation():
    a = make_class_order(100, seed=3)
    assert a.dtype == np.int64
    np.testing.assert_array_equal(np.sort(a), np.arange(100))
    np.testing.assert_array_equal(a, make_class_order(100, seed=3))
    assert not np.array_equal(a, make_class_order(100, seed=4))


def test_load_class_order_round_trip(tmp_path):
    path = tmp_path / "class_order" / "index-0.npy"
    path.parent.mkdir()
    np.save(path, ORDER_100.astype(np.int32))
    order = load_class_order(path, 100)
    assert order.dtype == np.int64
    np.testing.assert_array_equal(order, ORDER_100)
    # str paths work too
    np.testing.assert_array_equal(load_class_order(str(path), 100), ORDER_100)


def _write(path, content):
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        np.save(path, content, allow_pickle=True)
    return path


def _npy_bytes(array) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (np.array([0, 1, 1, 3, 4]), "not a permutation"),  # duplicates
        (np.arange(10), "10 entries but the data set has 5"),  # wrong length
        (np.arange(5, dtype=np.float64), "integer"),  # non-integer dtype
        (np.arange(5).reshape(1, 5), "1-D"),
        (np.array([0, 1, 2, 3, 4], dtype=object), "readable .npy"),  # needs pickle
        (b"this is not a numpy file\n", "readable .npy"),  # corrupt
        (_npy_bytes(np.arange(5))[:-12], "readable .npy"),  # truncated
        (b"", "readable .npy"),  # empty
    ],
)
def test_load_class_order_errors_name_the_file(tmp_path, content, match):
    path = _write(tmp_path / "index-3.npy", content)
    with pytest.raises(ClassOrderError, match=match) as err:
        load_class_order(path, 5)
    assert str(path) in str(err.value)


def test_load_class_order_missing_file(tmp_path):
    path = tmp_path / "class_order" / "index-9.npy"
    with pytest.raises(ClassOrderError, match="not found") as err:
        load_class_order(path, 100)
    assert str(path) in str(err.value)
