"""Everything the generated tests (``from nnatlas.testing import suite as T``) and nnatlas's own tests use: the
checks, the tiny-model helpers, the constants and the private pieces they share. ``nnatlas.testing`` itself
exports the few helpers a user calls (see its ``__all__``); this module is for the test suites."""

from __future__ import annotations

from .allocations import Allocations
from .cases import FIXED_SIZES, PROMPT, Case, _fixed_inputs, draw_case
from .edits import _check_edit, check_edit, check_readonly
from .examples import run_example
from .flex import uncompiled_flex_attention
from .gradients import (
    GRAD_BLOCK_VALUES,
    GRADIENT_COUNTS,
    GRADIENT_GAPS,
    LIGHT_KINDS,
    SOAK_KINDS,
    Held,
    Soak,
    _check_gradients,
    _close,
    _grad_seen_as,
    _plain_block_gradients,
    _scalar,
    check_gradients,
    grad_soak,
    live_tensors,
)
from .identities import _unavailable_term, check_identities, check_identity, identity_ids
from .image_text import (
    _vision_specs,
    check_image_input_errors,
    check_processor_round_trip,
    check_text_only_load,
    check_text_prompt,
)
from .layouts import draw_layout, moves_block_kinds, stack_periods, structural_options
from .oracle import (
    HIDDEN_STATES_AFTER_BLOCKS,
    ORACLE_ATOL,
    _accepts,
    _exact,
    _oracle_blocks,
    _oracle_hidden_states,
    _oracle_names,
    check_oracle,
    oracle_checks,
)
from .patterns import PATTERN_ERRORS, PATTERN_VALUES, check_recomputed_patterns, recomputed_pattern_loads
from .perturb import (
    NOT_FACTORS,
    config_factors,
    constant_tensors,
    perturb_config,
    perturb_params,
    perturb_tensors,
)
from .served import (
    _check_shapes,
    _first_host,
    _routable,
    _save_all,
    check_missing,
    check_native_class,
    check_shapes,
    check_support,
)
from .shrink import (
    AT_MOST,
    DENSE_FIRST,
    GROUPS,
    HEADS,
    HIDDEN,
    INTERMEDIATE,
    KV_HEADS,
    LAYERS,
    PERIOD,
    SIZES,
    SSM_HEADS,
    TOKEN_IDS,
    WINDOW,
    WINDOWS,
    ShrinkError,
    layout,
    shrink,
)
from .sweeps import SWEEP_ATOL, check_sweep, sweep_prompts
from .tiny import (
    CPU_ATTENTION,
    WORDS,
    _class_attention,
    _first,
    _nested_copy,
    _set_dotted,
    accepted_attention,
    adapter_module,
    attention_loads,
    build,
    check_attention_loads,
    draw_from,
    draw_inputs,
    draw_params,
    first_params,
    first_params_from,
    first_variant_params,
    image_prompt_inputs,
    perturbed_params,
    shared_build,
    tiny_images,
    tiny_of,
    tiny_processor,
    tiny_tokenizer,
    variant_from,
    variant_params,
)
from .twins import check_twin_builds, check_twin_identities, check_twin_oracle, checkpoints, twin, twin_params
from .values import (
    COMPARE,
    _block_index,
    _blocks_with,
    assert_identity,
    dims_of,
    each_host,
    expected_shape,
    host_specs,
    resolve_term,
    standard_values,
    tensor_term,
)

__all__ = ['Allocations', 'AT_MOST', 'DENSE_FIRST', 'GROUPS', 'HEADS', 'HIDDEN', 'INTERMEDIATE', 'KV_HEADS', 'LAYERS', 'PERIOD', 'SIZES', 'SSM_HEADS', 'TOKEN_IDS', 'WINDOW', 'WINDOWS', 'ShrinkError', 'draw_layout', 'layout', 'moves_block_kinds', 'stack_periods', 'structural_options', 'check_twin_builds', 'check_twin_identities', 'check_twin_oracle', 'checkpoints', 'shrink', 'twin', 'twin_params', 'COMPARE', 'CPU_ATTENTION', 'Case', 'SWEEP_ATOL', 'check_sweep', 'sweep_prompts', 'FIXED_SIZES', 'GRADIENT_COUNTS', 'GRADIENT_GAPS', 'GRAD_BLOCK_VALUES', 'HIDDEN_STATES_AFTER_BLOCKS', 'Held', 'LIGHT_KINDS', 'NOT_FACTORS', 'ORACLE_ATOL', 'PATTERN_ERRORS', 'PATTERN_VALUES', 'PROMPT', 'SOAK_KINDS', 'Soak', 'WORDS', '_accepts', '_block_index', '_blocks_with', '_check_edit', '_check_gradients', '_check_shapes', '_class_attention', '_close', '_exact', '_first', '_first_host', '_fixed_inputs', '_grad_seen_as', '_nested_copy', '_oracle_blocks', '_oracle_hidden_states', '_oracle_names', '_plain_block_gradients', '_routable', '_save_all', '_scalar', '_set_dotted', '_unavailable_term', '_vision_specs', 'accepted_attention', 'adapter_module', 'assert_identity', 'attention_loads', 'build', 'check_attention_loads', 'check_edit', 'check_gradients', 'check_identities', 'check_identity', 'check_image_input_errors', 'check_missing', 'check_native_class', 'check_oracle', 'check_processor_round_trip', 'check_readonly', 'check_recomputed_patterns', 'check_shapes', 'check_support', 'check_text_only_load', 'check_text_prompt', 'config_factors', 'constant_tensors', 'dims_of', 'draw_case', 'draw_from', 'draw_inputs', 'draw_params', 'each_host', 'expected_shape', 'first_params', 'first_params_from', 'first_variant_params', 'grad_soak', 'host_specs', 'identity_ids', 'image_prompt_inputs', 'live_tensors', 'oracle_checks', 'perturb_config', 'perturb_params', 'perturb_tensors', 'perturbed_params', 'recomputed_pattern_loads', 'resolve_term', 'run_example', 'shared_build', 'standard_values', 'tensor_term', 'tiny_images', 'tiny_of', 'tiny_processor', 'tiny_tokenizer', 'uncompiled_flex_attention', 'variant_from', 'variant_params']
