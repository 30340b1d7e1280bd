"""The spec files as pydantic models: unknown keys are errors, every field typed.

A family spec may ``extends:`` another, so every field of a family is optional here; the
resolver checks what a complete family needs after the merge.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

Scalar = StrictStr | StrictInt | StrictFloat | StrictBool | None


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


# ---- the shared vocabulary ---------------------------------------------------------------

class LayoutRaw(Strict):
    """A layout: a value's dims in order, and its dtype."""

    dims: StrictStr = Field(description="space-separated dims, e.g. 'batch seq hidden_size'; empty for a scalar")
    dtype: StrictStr = Field(default="float", description="float, long, bool or object")
    optional: StrictBool = Field(default=False, description="the value may be None")


class VocabValueRaw(Strict):
    """A standard value: its layout and its one-line meaning."""

    layout: StrictStr = Field(description="a layout of layouts:, e.g. Residual")
    meaning: StrictStr = Field(description="what the value is, in one line: every page shows these words")
    optional: StrictBool = Field(default=False, description='the value may be None ("State | None")')


class ConditionRaw(Strict):
    """A condition a value may need (``needs:``, a load condition) or be reached under (``reached:``, a call condition)."""

    says: StrictStr = Field(description="what the condition is, as support() and the pages say it")
    fix: StrictStr = Field(description="what meets it: the load or the call that serves the value")
    attribute: StrictStr | None = Field(
        default=None, description="a config attribute of the module the value is read in (or of the model) that "
        "decides it: attribute: _experts_implementation")
    values: list[StrictStr] = Field(default=[], description="the attribute's values that serve it: [grouped_mm, batched_mm]")
    kind: Literal["load", "call"] = Field(
        default="load", description="load: decided by how the model was loaded (attn_implementation, a processor); "
        "call: decided by the inputs of one call (images in the prompt), checked before the forward")
    never: StrictBool = Field(default=False, description="no load meets it: the value is Unavailable everywhere, with this reason")


class Vocabulary(Strict):
    """specs/_vocabulary.yaml: what every standard value is, written once for every family."""

    dims: dict[StrictStr, StrictStr] = Field(description="dim name → what it counts (batch, seq, hidden_size ...)")
    layouts: dict[StrictStr, LayoutRaw] = Field(description="layout name → its dims and dtype")
    values: dict[StrictStr, VocabValueRaw] = Field(description="standard value name → its layout and meaning")
    streams: dict[StrictStr, dict[StrictStr, VocabValueRaw]] = Field(
        default={}, description="stream name → values that mean something else on the hosts that say stream: NAME "
        "(a vision encoder's layer_input, a DeltaNet's attention_queries)")
    conditions: dict[StrictStr, ConditionRaw] = Field(default={}, description="condition name → what it says and what meets it")
    traits: dict[StrictStr, StrictStr] = Field(default={}, description="trait name → what it means (the chips on the pages)")
    modules: dict[StrictStr, StrictStr] = Field(
        default={}, description="standard module name → what it is: every name a spec gives a module (a host "
        "path's parts, a rename key) is one of these, so a new one is a choice written once, not a typo")


# ---- a family ----------------------------------------------------------------------------

class ValueRaw(Strict):
    """Where a standard value is read, in one of these forms: a read point (a string, short for {read: STRING});
    {read: ..., view: ..., needs: ...}; {derived: EXPRESSION}; {missing: WHY} (the family has none); or null,
    which drops an inherited value."""

    read: StrictStr | None = Field(default=None, description="a read point (see Read points)")
    derived: StrictStr | None = Field(
        default=None, description="an expression of the host's values, model.<value> and config entries "
        "(see Expressions): computed, read-only")
    view: StrictStr | None = Field(
        default=None, description="a view onto the layout: unflatten(-1, [num_heads, head_dim]).transpose(1, 2); "
        "views are views, so an edit of the served tensor lands in the model")
    needs: StrictStr | None = Field(default=None, description="a load condition of the vocabulary (eager, torch_kernels ...): ⚠︎ conditional")
    missing: StrictStr | None = Field(
        default=None, description="the family has no such value, and why: support() and the page say so; reading it "
        "raises Unavailable. Alone: no read, derived, view or needs")
    reached: StrictStr | None = Field(default=None, description="a call condition of the vocabulary (images): the value exists only on such calls")
    readonly: StrictStr | None = Field(default=None, description="why an edit here would reach nothing: the value is then read-only")
    edit: StrictStr = Field(
        default="logits", description='what an edit reaches: "logits" (this forward), "later" (only later calls: a '
        'state written to the cache), "none" (a record of what ran: read-only)')
    recompute: StrictStr | None = Field(
        default=None, description='"sdpa": an attention pattern read at eager\'s softmax in the host\'s own forward '
        '(op:softmax.input[0] or op:softmax.output, needs: eager), where under attn_implementation="sdpa" the '
        "forward calls torch's scaled_dot_product_attention instead: a trace that reads it recomputes eager's "
        "softmax from that call's queries, keys, scale and mask (Falcon). Reads inside eager attention "
        "(call:attention > op:...) are recomputed without it")
    served_copy: StrictBool = Field(
        default=False, alias="copy", description="a save keeps a copy taken when the value is produced, an edit "
        "is a copy put in the call's place: for a tensor the model changes in place later in the same run (a "
        "cache's state; Falcon's MLP output, to which the block adds the attention), so the saved value keeps "
        "what entered")


class IdentityRaw(Strict):
    """An equation the generated tests check on every drawn tiny config, at the config's defaults and perturbed
    (scalar factors drawn off their defaults, constant weights drawn: nnatlas.testing.perturb). A plain string is
    short for {check: STRING}. A term may name a parameter or buffer of a child module of the host's
    (router.e_score_correction_bias), besides values and config entries."""

    check: StrictStr = Field(description="lhs OP rhs, OP one of == != < <= > >= (see Expressions)")
    atol: StrictFloat | StrictInt = Field(default=0.0, description="absolute tolerance of ==")
    rtol: StrictFloat | StrictInt = Field(default=0.0, description="relative tolerance of ==")


class KindRaw(Strict):
    """One block kind of a hybrid stack: the blocks ``when`` selects, with their own values and identities, and,
    where the kinds of one host path are different modules, their own class (and stream, dims, conditions).
    A kind that names the same kind of an enclosing host (a kind of ``layers[i]`` on ``layers[i].mixer``) may
    leave out ``when``: it takes that kind's. A host that exists on one kind's blocks only says ``kind: NAME``."""

    when: StrictStr | None = Field(
        default=None, description="a block condition over the config and the block index i: layer_types[i] == "
        "'full_attention'; left out, the when of the kind of the same name on the nearest enclosing host")
    cls: StrictStr | None = Field(
        default=None, alias="class", description="the native class on this kind's blocks, where it differs from the "
        "host's (jamba's layers[i].mlp: JambaSparseMoeBlock on moe blocks, JambaMLP on dense ones)")
    stream: StrictStr | None = Field(default=None, description="the stream of this kind's values, where it differs from the host's")
    dims: dict[StrictStr, StrictStr] = Field(default={}, description="dims sized by another config entry on this kind, beside the host's")
    needs: StrictStr | None = Field(default=None, description="the load condition of this kind's values, unless a value says its own")
    reached: StrictStr | None = Field(default=None, description="the call condition of this kind's values, unless a value says its own")
    values: dict[StrictStr, StrictStr | ValueRaw | None] = Field(
        default={}, description="the kind's own values, beside the host's (null drops one of the host's on this kind)")
    identities: list[StrictStr | IdentityRaw] = Field(default=[], description="the kind's own identities, beside the host's")


class HostRaw(Strict):
    """A native module under a standard path (model, layers[i], layers[i].self_attn ...) and the values read there.
    A host may sit at an item of a list child of a block, by its fixed index (LongCat-Flash's two attentions a block:
    layers[i].self_attn[0] and layers[i].self_attn[1], model.layers[3].self_attn[1] at run time); an identity of the
    block names it so (self_attn[1].attention_output)."""

    cls: StrictStr | None = Field(default=None, alias="class", description="the native class (required once, here or in a base)")
    when: StrictStr | None = Field(default=None, description="a block condition: the host exists only on the blocks it selects")
    kind: StrictStr | None = Field(
        default=None, description="the host exists only on the blocks of this kind, declared under kinds: by an "
        "enclosing host (nemotron_h's layers[i].mixer.shared_experts, kind: moe); its when is that kind's")
    stream: StrictStr | None = Field(default=None, description="a stream of the vocabulary whose value meanings apply here")
    dims: dict[StrictStr, StrictStr] = Field(
        default={}, description="dims this host's values are sized by another config entry: "
        "{intermediate_size: shared_expert_intermediate_size}")
    needs: StrictStr | None = Field(default=None, description="the load condition of every value here, unless a value says its own")
    reached: StrictStr | None = Field(default=None, description="the call condition of every value here, unless a value says its own")
    values: dict[StrictStr, StrictStr | ValueRaw | None] = Field(
        default={}, description="standard value name → where it is read (a read point, {read: ...}, {derived: ...}, "
        "{missing: why}); null drops an inherited one")
    identities: list[StrictStr | IdentityRaw] = Field(default=[], description="equations between the host's values")
    kinds: dict[StrictStr, KindRaw] = Field(
        default={}, description="hybrid stacks: one entry per block kind, each with its when (model.<kind>_layers lists "
        "its blocks) and, where the kinds are different modules here, its class")


class RouteRaw(Strict):
    """How ``route_kernels(family, "torch")`` runs a function group token by token."""

    torch: StrictStr = Field(description="the pure-torch function each token's step calls")
    seq_dim: StrictInt = Field(default=1, description="the sequence dim of the sequence arguments and of the outputs")
    state_arg: StrictStr = Field(description="the argument that carries the state into a step")
    state_output: StrictInt = Field(description="the output element that is the state after a step")
    final_state_flag: StrictStr | None = Field(default=None, description="the argument asking the function to return its final state")


class FunctionRaw(Strict):
    """Module-level functions a host's forward calls, under one name: whichever the call runs."""

    names: list[StrictStr] = Field(description="globals of the host's modeling module (whichever the call runs)")
    words: StrictStr = Field(description="what the call is, for the pages")
    route: RouteRaw | None = Field(default=None, description="how route_kernels(family, 'torch') runs it token by token")


AttentionImpl = Literal["eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3"]


class LoadsRaw(Strict):
    """What loads as the family."""

    model_types: list[StrictStr] = Field(description="config model_type values (a multimodal wrapper is picked by its text_config's)")
    classes: list[StrictStr] = Field(description="model classes")
    attention: list[AttentionImpl] | None = Field(
        default=None, description="the attention implementations the model class accepts (attn_implementation=...); "
        "when not given, the generated tests read them from the class (_supports_sdpa, _supports_flex_attn)")


class ImagesRaw(Strict):
    """How the generated tests draw image inputs: how many images per prompt and their pixel sizes."""

    count: list[StrictInt] = Field(description="how many images per prompt (drawn)")
    sizes: list[tuple[StrictInt, StrictInt]] = Field(description="[height, width] pixel sizes (drawn)")


class ProcessorRaw(Strict):
    """A processor built locally for the tiny models: no hub, no torchvision."""

    cls: StrictStr = Field(alias="class", description="the processor class of transformers")
    image_processor: StrictStr = Field(description="the image processor class (a Pil one: no torchvision)")
    image_processor_config: dict[StrictStr, Any] = Field(default={}, description="its keyword arguments")
    tokens: list[StrictStr] = Field(default=[], description="special tokens given the ids after [PAD] [UNK] [BOS] [EOS], in order")
    config: dict[StrictStr, Any] = Field(default={}, description="keyword arguments of the processor class beside its image "
                                                                  "processor and tokenizer (LlavaProcessor's patch_size ...)")
    token_names: dict[StrictStr, StrictStr] = Field(default={}, description="tokenizer attributes naming some of tokens "
                                                                          "(Gemma 3's boi_token: '<start_of_image>' ...), as a "
                                                                          "checkpoint's tokenizer names them for its processor")


class TinyLoadRaw(Strict):
    """A second tiny load of the same family: the multimodal wrapper of a text model (Qwen3.5's
    Qwen3_5ForConditionalGeneration around Qwen3_5ForCausalLM's text model). The text config is
    the family's drawn tiny config (under text_config); ``config`` and ``draw`` add the rest."""

    model_class: StrictStr = Field(description="the wrapper's model class")
    config_class: StrictStr = Field(description="the wrapper's config class")
    config: dict[StrictStr, Any] = Field(default={}, description="fixed config entries")
    draw: dict[StrictStr, list[Scalar | list[Scalar]] | StrictStr] = Field(
        default={}, description="drawn config entries: a list of choices, or an expression of earlier entries")
    processor: ProcessorRaw = Field(description="the processor built for it")
    images: ImagesRaw = Field(description="the images drawn")
    examples: StrictInt = Field(default=3, description="hypothesis examples per test (3 to 1000)")


class FactorRaw(Strict):
    """How the perturbed tiny models draw one scalar factor of the config (found by rule from the config
    class: every float entry that is not an epsilon, a dropout, an init scale ...): a narrower range, or a
    value pinned with its reason (true of the released checkpoints), never silently."""

    range: tuple[StrictFloat | StrictInt, StrictFloat | StrictInt] | None = Field(
        default=None, description="[low, high]: the factor is drawn uniformly in it (each element of a list factor)")
    pin: StrictFloat | StrictInt | list[StrictFloat | StrictInt] | None = Field(
        default=None, description="the value the perturbed models keep (needs reason)")
    reason: StrictStr | None = Field(default=None, description="why the factor is pinned or narrowed (required with pin)")


class TinyLayoutRaw(Strict):
    """How the perturbed tiny models draw one structural option of the config (found by rule from the config class:
    dense-first counts, stack periods, block index lists, per-block kind lists, tie_word_embeddings, a sliding window
    on or off, bias flags): the choices narrowed, or the option pinned, each with its reason (true of the released
    checkpoints), never silently."""

    options: list[Scalar | list[Scalar]] | None = Field(
        default=None, description="the values the perturbed models draw from (needs reason)")
    pin: Scalar | list[Scalar] | None = Field(default=None, description="the value the perturbed models keep (needs reason)")
    reason: StrictStr | None = Field(default=None, description="why the option is narrowed or pinned (required)")


class TinyRaw(Strict):
    """The tiny random configs the generated tests draw, and their inputs."""

    model_class: StrictStr = Field(description="the transformers model class built")
    config_class: StrictStr = Field(description="its config class")
    config: dict[StrictStr, Any] = Field(default={}, description="fixed config entries (null passes None)")
    draw: dict[StrictStr, list[Scalar | list[Scalar]] | StrictStr] = Field(
        default={}, description="drawn config entries, in order: a list of choices, or an expression of entries "
        "drawn or fixed before it (n_embd: n_head * _head_dim; a name starting with _ is a helper, not passed)")
    batch: tuple[StrictInt, StrictInt] = Field(default=(1, 3), description="[low, high] of the batch size drawn")
    seq: tuple[StrictInt, StrictInt] = Field(default=(1, 8), description="[low, high] of the sequence length drawn")
    examples: StrictInt = Field(default=3, description="hypothesis examples per test (3 to 1000): each family's tests "
                                 "must stay cheap as families multiply; a reference family may ask for more")
    experts: list[StrictStr] = Field(
        default=[], description="the experts implementations (eager, batched_mm, grouped_mm) the generated tests run under")
    processor: ProcessorRaw | None = Field(default=None, description="a processor built locally, for image inputs")
    images: ImagesRaw | None = Field(default=None, description="the images drawn (needs processor)")
    image_text: TinyLoadRaw | None = Field(default=None, description="a second load: the multimodal wrapper of the text model")
    factors: dict[StrictStr, FactorRaw] = Field(
        default={}, description="the perturbed tiny models' scalar factors: a config entry -> {range: [low, high]} or "
        "{pin: value, reason: why}; every other factor is drawn away from its default (see nnatlas.testing.perturb)")
    layouts: dict[StrictStr, TinyLayoutRaw] = Field(
        default={}, description="the perturbed tiny models' structural options: a config entry -> {options: [...], "
        "reason: why} or {pin: value, reason: why}; every other one found by rule is drawn (see nnatlas.testing.layouts)")


class CheckpointRaw(Strict):
    """A released checkpoint: the page builds it on the meta device (offline) for its printout and config table."""

    name: StrictStr = Field(description="the hub name")
    config: dict[StrictStr, Any] = Field(description="its config.json entries, as released")


class NoteRaw(Strict):
    """A prose section of the page (Markdown); its python code blocks run in the generated tests on the tiny config."""

    title: StrictStr = Field(description="the section title")
    body: StrictStr = Field(description="Markdown: paragraphs, '- ' lists, pipe tables, `code`, **bold**, fenced python examples")
    load: Literal["text-generation", "image-text-to-text"] | None = Field(
        default=None, description="the load its examples run on (image-text-to-text: the tiny.image_text load)")


class SharedNoteRaw(Strict):
    """A reference to a group of notes written once in specs/_notes.yaml."""

    shared: StrictStr = Field(description="a group name of specs/_notes.yaml")


class UnavailableRaw(Strict):
    """A config entry no config value answers: reading it raises Unavailable with this reason."""

    unavailable: StrictStr = Field(description="why: reading the entry raises Unavailable with these words")


class DiagramRaw(Strict):
    """How the page draws the family (optional): each list names standard parts, in order.

    ``text``: the path of the tokens (default embed_tokens, layers, norm, lm_head); ``block``: one
    block of ``layers`` (default input_layernorm, mixer, add, post_attention_layernorm, mlp, add,
    where ``mixer`` stands for the block's mixer hosts of its kind, ``add`` for a residual add and
    ``mul:VALUE`` for a product with a value of the block (``mul:layer_scalar``); an item ``PART if
    VALUE`` is drawn only on the block kinds that serve VALUE, and a block that does not end on ``add``
    draws its output after its last part);
    ``vision`` and ``vision_block`` the same for the vision encoder, when the family has one.
    """

    text: list[StrictStr] | None = Field(default=None, description="the path of the tokens")
    block: list[StrictStr] | None = Field(default=None, description="one block of layers")
    vision: list[StrictStr] | None = Field(default=None, description="the vision encoder's path")
    vision_block: list[StrictStr] | None = Field(default=None, description="one vision block")
    vision_facts: dict[StrictStr, StrictStr] | None = Field(
        default=None, description="what the page says beside the vision path, term → one sentence (rows, "
        "positions, masking, final norm)")


class IncludeRaw(Strict):
    """A part a family includes (``specs/parts/<part>.yaml``), with its class map."""

    part: StrictStr = Field(description="the part's name: the file specs/parts/<part>.yaml")
    classes: dict[StrictStr, StrictStr] = Field(default={}, description="each class name the part uses → this family's class")


class PartRaw(Strict):
    """A shared fragment of specs (``specs/parts/<part>.yaml``): hosts, renames, config and
    functions written once for the families that include it. Its host classes are names the
    including family maps to its own (``classes``). A part is no family: nothing is generated for it."""

    part: StrictStr = Field(description="the part's name, the same as its file's")
    about: StrictStr | None = Field(default=None, description="what the part is, one line")
    classes: list[StrictStr] = Field(default=[], description="the class names the part's hosts use, each mapped by "
                                     "the including family's include: classes")
    rename: dict[StrictStr, StrictStr | list[StrictStr]] = Field(default={}, description="as a family's rename:")
    config: dict[StrictStr, StrictStr | StrictInt | StrictFloat | UnavailableRaw] = Field(
        default={}, description="as a family's config:")
    functions: dict[StrictStr, FunctionRaw] = Field(default={}, description="as a family's functions:")
    hosts: dict[StrictStr, HostRaw] = Field(default={}, description="as a family's hosts: (classes from the class map)")
    diagram: DiagramRaw | None = Field(default=None, description="as a family's diagram: (the vision path's facts)")


class FamilyRaw(Strict):
    """specs/FAMILY.yaml: one model family. With extends, every key but family may come from a base."""

    family: StrictStr = Field(description="the family's name, lowercase; the file is specs/<family>.yaml")
    extends: StrictStr | list[StrictStr] | None = Field(
        default=None, description="one base, or several merged left to right (a later base overrides an earlier "
        "one; this file, all of them)")
    include: list[IncludeRaw] = Field(
        default=[], description="the parts this family is made of besides its own file (specs/parts/<part>.yaml, "
        "each with its class map); not inherited by families that extend it")
    title: StrictStr | None = Field(default=None, description="the page title (required)")
    lines: list[StrictStr] | None = Field(default=None, description="the product names (required)")
    summary: StrictStr | None = Field(default=None, description="one paragraph (required)")
    traits: list[StrictStr] | None = Field(default=None, description="traits of the vocabulary (required)")
    loads: LoadsRaw | None = Field(default=None, description="which model types and classes load as the family (required)")
    rename: dict[StrictStr, StrictStr | list[StrictStr]] = Field(
        default={}, description="standard name → native path or paths: layers: [model.layers, "
        "model.language_model.layers]; vision.layers[i].self_attn: attn")
    modules: dict[StrictStr, StrictStr] = Field(
        default={}, description="module names of this family alone, outside the vocabulary's modules:, each with "
        "what it is (a draft names a native module it could not map this way): attention_input: the block's ...")
    config: dict[StrictStr, StrictStr | StrictInt | StrictFloat | UnavailableRaw] = Field(
        default={}, description="normalized config entry → a config attribute, an expression (see Expressions) "
        "or {unavailable: why}; model.NAME reads it")
    presets: list[StrictStr] = Field(
        default=[], description="named bundles of config entries taken whole (no_attention: an attention-free "
        "family's head sizes raise Unavailable); an entry the spec's config writes wins")
    functions: dict[StrictStr, FunctionRaw] = Field(
        default={}, description="a name for module-level functions the forward calls (fn:NAME read points)")
    hosts: dict[StrictStr, HostRaw] = Field(default={}, description="host path → its native class and values; 'model' is required")
    tiny: TinyRaw | None = Field(default=None, description="the tiny configs of the generated tests (required)")
    checkpoints: list[CheckpointRaw] = Field(default=[], description="released configs the page prints")
    notes: list[NoteRaw | SharedNoteRaw] = Field(default=[], description="the page's prose sections, in order")
    docstring: StrictStr | None = Field(default=None, description="the adapter module's docstring (default: the summary)")
    diagram: DiagramRaw | None = Field(default=None, description="how the page draws the family")
