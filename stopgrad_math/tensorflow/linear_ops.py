"""The table of TensorFlow ops a grad_fn may apply to its upstream gradient, and what each means for J.

The decorator embeds grad_fn as the linear map it is the transpose of. That
is exact only where every op between the upstream ``d`` and grad_fn's
results is linear in the inputs that carry ``d`` (the zero upstream maps to
zero, sums to sums) and, for the transpose trick, where TensorFlow's
registered gradient of the op is its exact transpose. Each op is put in one
of four kinds, from what the op is, never from a numerical probe:

  LINEAR      linear in its upstream-carrying inputs, its gradient the exact
              transpose: J·v read off the tape is exact
  OPAQUE      linear, but its gradient is not its transpose (a stop, a
              custom or missing gradient, external code): J only from
              grad_fn on unit upstreams
  NONLINEAR   not linear in the upstream (clipping, normalizing, relu, an
              added constant): no stop-gradient identity can express it
  UNTRUSTED   not in this table: never assumed linear

Ops whose output does not depend on their input's values (``ZerosLike``,
``Shape``) are VALUE_FREE: nothing of the upstream passes through them.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from stopgrad_math.tensorflow import _tf_internal, identity


class Kind(enum.Enum):
    """What an op on the upstream's path means for the embedding of grad_fn."""

    LINEAR = "linear, its gradient the exact transpose"
    OPAQUE = "linear, but its registered gradient is not its transpose"
    NONLINEAR = "not linear in the upstream gradient"
    UNTRUSTED = "not in the table of ops known to be linear"
    VALUE_FREE = "its output does not depend on the upstream's values"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """An op's kind, and why, in words for an error message."""

    kind: Kind
    why: str = ""


_LINEAR = Verdict(Kind.LINEAR)
CUSTOM_GRADIENT = Verdict(Kind.OPAQUE, "an op with a custom gradient (tf.custom_gradient, a gradient override)")

# Ops whose outputs depend only on their inputs' shapes and dtypes.
VALUE_FREE = frozenset({"ZerosLike", "OnesLike", "Shape", "ShapeN", "Size", "Rank", "BroadcastGradientArgs"})

# Linear in each input that carries the upstream, whatever the others are (indices, shapes, permutations,
# axes, segment ids are integers and never carry it).
STRUCTURAL = frozenset({
    "Identity", "Snapshot", "EnsureShape", "CheckNumerics", "CheckNumericsV2", "Neg",
    "Reshape", "Transpose", "ConjugateTranspose", "ExpandDims", "Squeeze", "BroadcastTo", "Tile", "Fill",
    "Slice", "StridedSlice", "StridedSliceGrad", "TensorStridedSliceUpdate",
    "Gather", "GatherV2", "GatherNd", "ScatterNd", "TensorScatterAdd", "TensorScatterSub",
    "UnsortedSegmentSum", "SegmentSum", "SparseSegmentSum", "SparseSegmentMean", "SparseSegmentSqrtN",
    "Sum", "Mean", "Cumsum", "ConcatV2", "Concat", "Pack", "Unpack", "Split", "SplitV", "Pad", "MirrorPad",
    "Reverse", "ReverseV2", "Roll", "MatrixDiag", "MatrixDiagV2", "MatrixDiagV3", "MatrixDiagPart",
    "MatrixDiagPartV2", "MatrixDiagPartV3", "MatrixSetDiag", "MatrixSetDiagV2", "MatrixSetDiagV3", "Diag",
    "DiagPart", "MatrixBandPart", "Real", "Imag", "Conj", "FFT", "IFFT", "FFT2D", "IFFT2D", "FFT3D", "IFFT3D",
    "RFFT", "IRFFT", "RFFT2D", "IRFFT2D", "RFFT3D", "IRFFT3D", "AvgPool", "AvgPool3D",
    "SpaceToBatchND", "BatchToSpaceND", "SpaceToDepth", "DepthToSpace", "ResizeBilinear",
    "ResizeNearestNeighbor", "ExtractImagePatches", "TensorScatterUpdate", "XlaDynamicUpdateSlice",
    "XlaDynamicSlice", "XlaPad", "IdentityN", "TensorListFromTensor", "TensorListStack", "TensorListGetItem",
    "TensorListSetItem", "TensorListPushBack", "TensorListPopBack", "TensorListReserve",
})  # fmt: skip

# Linear in exactly one input: the other factor must not carry the upstream too.
PRODUCTS = frozenset({
    "Mul", "MulNoNan", "MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum", "Conv2D",
    "Conv3D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2",
    "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter", "Cross",
    "SparseTensorDenseMatMul", "SparseMatMul",
})  # fmt: skip

# Linear in their first input only: a quotient is linear in its numerator.
QUOTIENTS = frozenset({"RealDiv", "Div", "DivNoNan"})

# Linear in their right-hand side (input 1) where the matrix (input 0) does not carry the upstream: x = A⁻¹b, the
# adjoint solve of an implicit gradient. Each one's gradient in b is the solve with Aᴴ, its exact transpose.
SOLVES = frozenset({"MatrixSolve", "MatrixTriangularSolve", "BandedTriangularSolve", "TridiagonalSolve"})

# The gradient ops of the standard layers, by the input that is the upstream gradient: each is the chain rule's
# product of that input by a Jacobian of the others (the saved features or outputs, the pooled input and output,
# the batch statistics), linear in it where no other input carries the upstream. None branches on, clips or scales
# by the upstream's own values: ReluGrad selects by the saved features, MaxPoolGrad routes by the saved input and
# output, FusedBatchNormGradV3 is linear in y_backprop given x and the saved statistics.
LAYER_GRADIENTS = {
    **dict.fromkeys(("ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad", "LeakyReluGrad", "SoftplusGrad",
                     "SoftsignGrad", "BiasAddGrad", "FusedBatchNormGrad", "FusedBatchNormGradV2",
                     "FusedBatchNormGradV3", "ResizeBilinearGrad", "ResizeNearestNeighborGrad", "ResizeBicubicGrad",
                     "MirrorPadGrad", "LRNGrad"), 0),
    **dict.fromkeys(("SigmoidGrad", "TanhGrad", "RsqrtGrad", "SqrtGrad", "ReciprocalGrad", "InvGrad",
                     "AvgPoolGrad", "AvgPool3DGrad"), 1),
    **dict.fromkeys(("MaxPoolGrad", "MaxPoolGradV2", "MaxPool3DGrad"), 2),
}  # fmt: skip

# Linear only where every input that does not carry the upstream is zero: otherwise affine.
SUMS = frozenset({"AddV2", "Add", "Sub", "AddN", "BiasAdd", "Complex", "PadV2"})

# Choose elementwise by a condition: linear where the condition does not depend on the upstream.
SELECTS = frozenset({"Select", "SelectV2"})

# Linear ops whose gradient is not their transpose.
OPAQUE = {
    "StopGradient": "a stop_gradient (tf.while_loop(back_prop=False) adds one): its gradient is zero",
    "PreventGradient": "a PreventGradient: its gradient raises",
    "PyFunc": "a tf.numpy_function: Python code no tape can see into",
    "PyFuncStateless": "a tf.numpy_function: Python code no tape can see into",
    "EagerPyFunc": "a tf.py_function: Python code no tape can see into",
}

# Collectives run with every replica; a per-replica identity cannot carry their cross-replica derivative.
COLLECTIVES = frozenset({
    "CollectiveReduce", "CollectiveReduceV2", "CollectiveReduceV3", "CollectiveGather", "CollectiveGatherV2",
    "CollectiveBcastSend", "CollectiveBcastRecv", "CollectiveBcastSendV2", "CollectiveBcastRecvV2",
    "CollectiveAllToAllV2", "CollectiveAllToAllV3", "CollectiveReduceScatterV2", "NcclAllReduce", "NcclReduce",
    "NcclBroadcast", "XlaReduceScatter", "AllToAll", "CrossReplicaSum",
})  # fmt: skip

_NONLINEAR_GROUPS = {
    "clips or rectifies it": ("Relu", "Relu6", "Elu", "Selu", "LeakyRelu", "Softplus", "Softsign", "Maximum",
                              "Minimum", "ClipByValue", "Max", "Min"),
    "takes its sign, magnitude or a norm of it": ("Abs", "ComplexAbs", "Sign", "EuclideanNorm", "L2Loss"),
    "takes a power, root or inverse of it": ("Square", "Sqrt", "Rsqrt", "Pow", "Reciprocal", "Inv", "Prod",
                                             "SquaredDifference", "Xlogy", "Xdivy", "Xlog1py"),
    "applies a transcendental function to it": ("Exp", "Expm1", "Log", "Log1p", "Tanh", "Sigmoid", "Sin", "Cos",
                                                "Tan", "Atan", "Atan2", "Asin", "Acos", "Sinh", "Cosh", "Erf",
                                                "Erfc", "Lgamma", "Digamma", "Softmax", "LogSoftmax"),
    "rounds it": ("Round", "Rint", "Floor", "Ceil", "FloorDiv", "FloorMod", "Mod", "TruncateMod"),
    "compares it (a result chosen by the upstream's own values)": (
        "Greater", "GreaterEqual", "Less", "LessEqual", "Equal", "NotEqual", "ArgMax", "ArgMin", "IsFinite",
        "IsNan", "IsInf", "TopKV2", "Unique"),
}  # fmt: skip
NONLINEAR = {op: why for why, ops in _NONLINEAR_GROUPS.items() for op in ops}


def classify(op: tf.Operation, carrying: Sequence[bool], zero: Callable[[tf.Tensor], bool] | None = None) -> Verdict:
    """The kind of ``op`` where its inputs ``carrying`` (one flag per input) carry the upstream gradient;
    ``zero`` says which tensors are known to be zero (``is_zero`` by default)."""
    if op.type in VALUE_FREE:
        return Verdict(Kind.VALUE_FREE)
    if _custom_gradient(op):
        return CUSTOM_GRADIENT
    if op.type in COLLECTIVES:
        return Verdict(Kind.NONLINEAR, "a collective across replicas, which a per-replica identity cannot carry")
    if op.type in OPAQUE:
        return Verdict(Kind.OPAQUE, OPAQUE[op.type])
    if op.type in NONLINEAR:
        return Verdict(Kind.NONLINEAR, f"it {NONLINEAR[op.type]}")
    rule = _RULES.get(op.type)
    if rule is None:
        return Verdict(Kind.UNTRUSTED,
                       "an op not in the table of ops known to be linear (stopgrad_math.tensorflow.linear_ops)")
    verdict = rule(op, carrying, zero or is_zero)
    if verdict.kind is Kind.LINEAR and not _has_gradient(op):
        return Verdict(Kind.OPAQUE, "an op with no registered gradient")
    return verdict


def _custom_gradient(op: tf.Operation) -> bool:
    """Whether the op's gradient was replaced: tf.custom_gradient's IdentityN, a gradient_override_map."""
    try:
        op.get_attr("_gradient_op_type")
    except ValueError:
        return False
    return True


def _has_gradient(op: tf.Operation) -> bool:
    try:
        return _tf_internal.gradient_function(op) is not None
    except LookupError:
        return False


def _inexact_inputs(op: tf.Operation) -> list[int]:
    return [k for k, t in enumerate(op.inputs) if identity.is_inexact(t.dtype)]


def _structural(op: tf.Operation, carrying: Sequence[bool], zero: Callable[[tf.Tensor], bool]) -> Verdict:
    return _LINEAR


def _product(op: tf.Operation, carrying: Sequence[bool], zero: Callable[[tf.Tensor], bool]) -> Verdict:
    if sum(carrying[k] for k in _inexact_inputs(op)) > 1:
        return Verdict(Kind.NONLINEAR, "it multiplies the upstream by itself")
    return _LINEAR


def _quotient(op: tf.Operation, carrying: Sequence[bool], zero: Callable[[tf.Tensor], bool]) -> Verdict:
    return Verdict(Kind.NONLINEAR, "it divides by the upstream") if carrying[1] else _LINEAR


def _solve(op: tf.Operation, carrying: Sequence[bool], zero: Callable[[tf.Tensor], bool]) -> Verdict:
    return Verdict(Kind.NONLINEAR, "it solves with a matrix the upstream reaches") if carrying[0] else _LINEAR


def _sum(op: tf.Operation, carrying: Sequence[bool], zero: Callable[[tf.Tensor], bool]) -> Verdict:
    constant = [k for k in _inexact_inputs(op) if not carrying[k] and not zero(op.inputs[k])]
    if constant:
        return Verdict(Kind.NONLINEAR, "it adds a term that does not depend on the upstream and is not zero "
                                       "(an affine map)")
    return _LINEAR


def _select(op: tf.Operation, carrying: Sequence[bool], zero: Callable[[tf.Tensor], bool]) -> Verdict:
    if carrying[0]:
        return Verdict(Kind.NONLINEAR, "it chooses by the upstream's own values")
    return _sum(op, [True, *carrying[1:]], zero)  # a branch that does not carry the upstream must be zero


def _layer_gradient(op: tf.Operation, carrying: Sequence[bool], zero: Callable[[tf.Tensor], bool]) -> Verdict:
    upstream = LAYER_GRADIENTS[op.type]
    if any(carrying[k] for k in _inexact_inputs(op) if k != upstream):
        return Verdict(Kind.NONLINEAR, "the upstream reaches an input that is not the gradient it scales (a saved "
                                       "activation, a statistic)")
    return _LINEAR


def _cast(op: tf.Operation, carrying: Sequence[bool], zero: Callable[[tf.Tensor], bool]) -> Verdict:
    if identity.is_inexact(op.outputs[0].dtype):
        return _LINEAR
    return Verdict(Kind.NONLINEAR, "it casts the upstream to an integer or bool type")


_Rule = Callable[[tf.Operation, Sequence[bool], Callable[[tf.Tensor], bool]], Verdict]
_RULES: dict[str, _Rule] = {
    **dict.fromkeys(STRUCTURAL, _structural),
    **dict.fromkeys(PRODUCTS, _product),
    **dict.fromkeys(QUOTIENTS, _quotient),
    **dict.fromkeys(SOLVES, _solve),
    **dict.fromkeys(SUMS, _sum),
    **dict.fromkeys(SELECTS, _select),
    **dict.fromkeys(LAYER_GRADIENTS, _layer_gradient),
    "Cast": _cast,
}

# Ops that pass a zero on: their result is zero wherever their first input is (the others are shapes, indices).
_ZERO_PRESERVING = frozenset({"Identity", "Reshape", "BroadcastTo", "ExpandDims", "Squeeze", "Tile", "Cast",
                              "Transpose", "Neg", "StopGradient"})


def is_zero(tensor: tf.Tensor) -> bool:
    """Whether a graph tensor is zero, decided from the ops that make it (no value is computed)."""
    value = tf.get_static_value(tensor)
    if value is not None:
        return bool(np.all(np.asarray(value) == 0))
    op = tensor.op
    if op.type == "ZerosLike":
        return True
    if op.type == "Fill":
        return is_zero(op.inputs[1])
    if op.type in _ZERO_PRESERVING:
        return is_zero(op.inputs[0])
    return _captured_zero(tensor)


def _captured_zero(tensor: tf.Tensor) -> bool:
    """Whether a function's placeholder stands for an eager tensor of zeros (a closed-over eager value)."""
    captured = _tf_internal.captured_value(tensor)
    return captured is not None and bool(np.all(np.asarray(captured) == 0))
