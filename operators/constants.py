"""String enums shared by the operators and their runners (defined once, in core)."""

from __future__ import annotations

from embedfresh.core.settings import ARTIFACT_ROOT_ENV, ExecutionMode

__all__ = ["ARTIFACT_ROOT_ENV", "ExecutionMode"]
