"""The helpers of :mod:`quire.errors`."""

from __future__ import annotations

from quire.errors import ContainerClosedError, SegmentTruncatedError, fresh_copy


def test_a_fresh_copy_is_a_new_error_of_the_same_kind_with_the_same_cause() -> None:
    cause = OSError("disk gone")
    error = ContainerClosedError("closed")
    error.__cause__ = cause
    copy = fresh_copy(error)
    assert copy is not error
    assert type(copy) is ContainerClosedError
    assert copy.args == ("closed",)
    assert copy.__cause__ is cause
    assert copy.__traceback__ is None


def test_an_error_its_class_cannot_build_again_from_its_args_is_given_back() -> None:
    error = SegmentTruncatedError("below the start", 5)  # args ("below the start",) only
    assert fresh_copy(error) is error
