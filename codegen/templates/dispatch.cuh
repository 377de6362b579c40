// PUBLIC API (everything else is an implementation detail):
//
//   enum fa2tune_dtype { FA2TUNE_FP16, FA2TUNE_BF16 };
//
//   cudaError_t fa2tune_forward(const FaParams& p, int head_dim, fa2tune_dtype dtype,
//                               bool causal, cudaStream_t stream = 0);
//     Launches softmax(Q K^T * p.softmax_scale) V on `stream` (asynchronously). FaParams is
//     the kernel ABI struct defined below: Q, K, V, O pointers (16-byte aligned), element
//     strides (multiples of 8; the head dim is contiguous), batch, q_heads, kv_heads
//     (q_heads % kv_heads == 0), nq, nk, softmax_scale, and an optional float32 LSE output
//     [batch, q_heads, nq]. Causal is bottom-right aligned (query i sees key j iff
//     j <= i + nk - nq), so with nq == 1 it masks nothing and the call is served as
//     unmasked (the configs tuned for decode). Returns cudaErrorInvalidValue for a head dim or dtype this header
//     was not generated for or for misaligned/invalid parameters; otherwise the launch's
//     status.
//
//   size_t fa2tune_workspace_size(const FaParams& p, int head_dim, fa2tune_dtype dtype,
//                                 bool causal);
//   cudaError_t fa2tune_forward_with_workspace(const FaParams& p, int head_dim,
//                                              fa2tune_dtype dtype, bool causal,
//                                              void* workspace, size_t workspace_bytes,
//                                              cudaStream_t stream = 0);
//     For callers that manage device memory themselves. fa2tune_workspace_size is the bytes
//     of scratch the config fa2tune_forward would launch on the current device needs for p:
//     0 for every family but the split-KV one (splitkv, names "splitkv_..."), and 0 for
//     invalid parameters. fa2tune_forward_with_workspace launches like fa2tune_forward, but a
//     splitkv config uses the caller's buffer (at least fa2tune_workspace_size bytes, 16-byte
//     aligned; cudaErrorInvalidValue otherwise) instead of one the header allocates; other
//     families ignore it (it may be nullptr when the size is 0). The contract: zero-fill the
//     buffer (cudaMemset) once before its first use. A launch leaves it ready for any later
//     launch ordered after it (the same stream, or synchronised) whose nq, batch, q_heads and
//     kv_heads are the same (nk and the config may change); zero it again before a launch
//     with other values of those, or after a launch that failed. Two launches that may run
//     at the same time need two buffers.
//     Without a workspace (fa2tune_forward), a splitkv config allocates its own on the first
//     launch that needs one, one per (device, stream), grow-only and kept for the process:
//     launch every shape once before capturing a CUDA graph (cudaMalloc cannot be captured);
//     or use fa2tune_forward_with_workspace, which allocates nothing.
//
//   const char* fa2tune_config_name(const FaParams& p, int head_dim, fa2tune_dtype dtype,
//                                   bool causal);
//     The config fa2tune_forward would launch (nullptr when it would refuse).
//
//   struct fa2tune_tuned_choice { int index; const char* name; double distance;
//                                 int nq, nk, batch, q_heads, kv_heads; };
//   bool fa2tune_nearest_tuned(int head_dim, fa2tune_dtype dtype, bool causal, int nq,
//                              int nk, int batch, int q_heads, int kv_heads, int sm_count,
//                              fa2tune_tuned_choice* out);
//     Which tuned entry the dispatch takes for a call of this shape on the tuned GPU with
//     sm_count SMs, without launching or touching a device (so without the family guards
//     below, which need both): its index among the (D, dtype, causal)'s tuned entries (in
//     the order the comment above lists them), config name, distance and tuned shape. False
//     when the header has no tuned entry for (D, dtype, causal) of the call's phase (a
//     decode step, nq <= 16, is answered by tuned decode shapes only, a longer call by
//     prefill shapes only; the default runs otherwise) or the shape is invalid.
//
//   cudaError_t fa2tune_forward_varlen(const FaParams& p, const FaVarlen& v, int num_seqs,
//                                      int max_seqlen_q, int max_seqlen_k, int head_dim,
//                                      fa2tune_dtype dtype, bool causal,
//                                      cudaStream_t stream = 0);
//     A packed variable-length batch (FlashAttention-2's varlen forward): the num_seqs
//     sequences' rows are packed one after another, Q and O [total_q, q_heads, D], K and V
//     [total_k, kv_heads, D] (p's row and head strides; its batch strides, batch, nq and nk
//     are ignored). FaVarlen (fa_params.cuh, inlined below) gives their int32 cumulative
//     offsets on the device, cu_seqlens_q and cu_seqlens_k ([num_seqs + 1] each, starting at
//     0), and two host values:
//       v.total_q  = cu_seqlens_q[num_seqs], the packed Q/O row count;
//       v.reserved = total_k = cu_seqlens_k[num_seqs], the packed K/V row count.
//     Set both. fa2 configs ignore v.reserved; the Hopper family's (fa3 "_vl" configs) bound
//     the TMA descriptors of K and V by it, so when the dispatch picks one (see "Varlen
//     dispatch") a total_k below max_seqlen_k, such as the 0 of a caller that leaves it unset,
//     is refused with cudaErrorInvalidValue. max_seqlen_q/k are the longest query/key
//     sequence (they size the grid). The optional LSE output is float32 [q_heads, total_q].
//     Causal is bottom-right aligned per sequence. More sequences than grid z's 65,535 are
//     launched in slices of the offsets, in order on `stream`.
//     Returns cudaErrorInvalidValue for num_seqs < 1, max_seqlen_q < 1, max_seqlen_k < 0,
//     total_q < max_seqlen_q, null or misaligned offsets, a head dim or dtype this header was
//     not generated for, parameters fa2tune_forward would refuse, or (fa3 pick) total_k <
//     max_seqlen_k; otherwise the launch's status. Only the host-side values are checked: the
//     offsets must describe the packed tensors, and total_k must be K's and V's row count.
//
//   const char* fa2tune_config_name_varlen(const FaParams& p, const FaVarlen& v,
//                                          int num_seqs, int max_seqlen_q, int max_seqlen_k,
//                                          int head_dim, fa2tune_dtype dtype, bool causal);
//     The config fa2tune_forward_varlen would launch (nullptr when it would refuse the call
//     before choosing; an fa3 pick's total_k is checked by its launch only).
//
//   bool fa2tune_nearest_tuned_varlen(int head_dim, fa2tune_dtype dtype, bool causal,
//                                     int num_seqs, int total_q, int q_heads, int kv_heads,
//                                     int sm_count, fa2tune_tuned_choice* out);
//     fa2tune_nearest_tuned for packed batches: the tuned varlen entry a batch of num_seqs
//     sequences and total_q query rows gets on the tuned GPU (its nq and nk are the tuned
//     batch's mean length, batch its count of sequences), without the family guards (as
//     fa2tune_nearest_tuned: an fa3 entry is named even where it cannot run). False when the
//     header has no tuned varlen entry for (D, dtype, causal) or the arguments are invalid.
//
//   Attention variants (docs/variants.md: a sliding window, a chunk, a logit softcap,
//   attention sinks, alone or together), FlashAttention's semantics, bottom-right aligned:
//
//   cudaError_t fa2tune_forward_variant(const FaParams& p, const FaVariant& var, int head_dim,
//                                       fa2tune_dtype dtype, bool causal,
//                                       cudaStream_t stream = 0);
//     fa2tune_forward with an attention variant. FaVariant (fa_params.cuh, inlined below)
//     carries its run-time values as FlashAttention's arguments spell them:
//       var.window_left, var.window_right  window_size: query i (key position
//                       pos = i + nk - nq) sees key j only if pos - left <= j <= pos + right;
//                       -1 is no bound (causal is the right bound 0);
//       var.chunk       attention_chunk: > 0 keeps only the keys of pos's chunk
//                       [pos - pos mod chunk, + chunk); 0 is none;
//       var.softcap     softcap: > 0 turns each softmax-scaled score s into
//                       softcap * tanh(s / softcap); 0 is none;
//       var.sinks       sinks: a device pointer to q_heads float32 logits (GPT-OSS's
//                       attention sinks) that join every row's softmax denominator, the LSE
//                       included; nullptr is none (FaVariant has no other sinks flag).
//     The call is normalised first, as fa2tune's store and PyTorch op normalise it
//     (core.variant.normalize): a bound reaching past every key (left >= nk - 1,
//     right >= nq - 1) is none, and so is a chunk holding every key (chunk >= nk >= nq); a
//     right bound 0 is causal; one query row (nq == 1, decode) is unmasked, so its right
//     bound is dropped and a decode step spelled (L, 0) causal is the unmasked call with
//     left bound L; a causal call's right bound is 0. A variant that is then plain attention
//     (no bound, chunk, cap or sinks) is fa2tune_forward's call, with its statuses. Otherwise
//     the config comes from the variant dispatch ("Variant dispatch" below). A row that sees
//     no key gets O = 0 and LSE = -inf, or with sinks its head's sink logit.
//     Returns cudaErrorInvalidValue for what fa2tune_forward refuses and for values out of
//     their domain: a window bound below -1, a chunk below 0, a softcap below 0 or not
//     finite (NaN, inf), a sinks pointer not aligned for float; cudaErrorNotSupported when
//     the header has no kernels of the call's switches (local: a window or a chunk; softcap;
//     sinks) at its head dim, dtype and mask: results of that variant were not exported
//     into this header (re-export after tuning it), including head dims and dtypes the
//     header was not generated for; otherwise the launch's status.
//
//   size_t fa2tune_workspace_size_variant(const FaParams& p, const FaVariant& var,
//                                         int head_dim, fa2tune_dtype dtype, bool causal);
//   cudaError_t fa2tune_forward_variant_with_workspace(const FaParams& p, const FaVariant& var,
//                                                      int head_dim, fa2tune_dtype dtype,
//                                                      bool causal, void* workspace,
//                                                      size_t workspace_bytes,
//                                                      cudaStream_t stream = 0);
//     fa2tune_workspace_size and fa2tune_forward_with_workspace for a variant call (the
//     split-KV family's variant configs take the caller's workspace; the same contract; 0
//     bytes for invalid values or a variant the header cannot run).
//
//   const char* fa2tune_config_name_variant(const FaParams& p, const FaVariant& var,
//                                           int head_dim, fa2tune_dtype dtype, bool causal);
//     The config fa2tune_forward_variant would launch (nullptr when it would refuse).
//
//   struct fa2tune_tuned_variant_choice { int index; const char* name; double distance;
//                                         int nq, nk, batch, q_heads, kv_heads; bool causal;
//                                         int window_left, window_right, chunk;
//                                         bool same_variant; };
//   bool fa2tune_nearest_tuned_variant(const FaVariant& var, int head_dim, fa2tune_dtype dtype,
//                                      bool causal, int nq, int nk, int batch, int q_heads,
//                                      int kv_heads, int sm_count,
//                                      fa2tune_tuned_variant_choice* out);
//     fa2tune_nearest_tuned for a variant call: the tuned entry the variant dispatch takes on
//     the tuned GPU with sm_count SMs, without a device (so without the family guards): its
//     index among the tuned entries of the call's (D, dtype, mask, switches) (in the order
//     the comment above lists them), config name, shape distance and tuned shape, the mask
//     the call is served as (normalised), the entry's window and chunk (store's form) and
//     whether they are the call's. var.sinks is not read (non-null: sinks). A variant that
//     normalises to plain attention gets fa2tune_nearest_tuned's plain entry (window -1, -1,
//     chunk 0). False when nothing of the call's switches is tuned at (D, dtype, mask), or
//     for invalid arguments.
//
//   cudaError_t fa2tune_forward_varlen_variant(const FaParams& p, const FaVarlen& v,
//                                              const FaVariant& var, int num_seqs,
//                                              int max_seqlen_q, int max_seqlen_k,
//                                              int head_dim, fa2tune_dtype dtype, bool causal,
//                                              cudaStream_t stream = 0);
//   const char* fa2tune_config_name_varlen_variant(const FaParams& p, const FaVarlen& v,
//                                                  const FaVariant& var, int num_seqs,
//                                                  int max_seqlen_q, int max_seqlen_k,
//                                                  int head_dim, fa2tune_dtype dtype,
//                                                  bool causal);
//   bool fa2tune_nearest_tuned_varlen_variant(const FaVariant& var, int head_dim,
//                                             fa2tune_dtype dtype, bool causal, int num_seqs,
//                                             int total_q, int max_seqlen_q,
//                                             int max_seqlen_k, int q_heads, int kv_heads,
//                                             int sm_count,
//                                             fa2tune_tuned_variant_choice* out);
//     The packed twins (fa2tune_forward_varlen's arguments and contract, total_k in
//     v.reserved included, plus the variant), applied per sequence with its own lengths. The
//     variant is normalised with the longest lengths, as fa2tune's PyTorch op does for packed
//     batches: the window rules hold for every sequence; a chunk is kept whatever its
//     length (the longest lengths do not tell that every sequence has as many keys as
//     queries); a batch whose longest query sequence has one row is unmasked.
//
//   KV caches (FlashAttention's flash_attn_with_kvcache, the C++ twin of
//   fa2tune.torch.attention_with_kvcache): only in a header exported with page sizes
//   (fa2tune export --kv-pages 0,16,...; 0 is a contiguous cache), which defines
//   FA2TUNE_HAS_KVCACHE (codegen/templates/kvcache_dispatch.cuh, inlined at the end):
//
//   cudaError_t fa2tune_forward_kvcache(const FaParams& p, const FaKvCache& kc,
//                                       const FaKvAppend* append, int page_size,
//                                       const FaVariant* var, int head_dim,
//                                       fa2tune_dtype dtype, bool causal,
//                                       cudaStream_t stream = 0);
//     Optionally appends new K/V rows to the cache in place, then attends Q to each
//     sequence's cached keys plus the new ones. Each sequence's length lives on the device,
//     so one call (or one captured CUDA graph) serves every step of a decode loop. p's k and
//     v are the caches, [rows, capacity, kv_heads, D] (contiguous, page_size 0; k/v batch
//     strides between cache rows) or [pages, page_size, kv_heads, D] (paged; batch strides
//     between pages); p.nk is the capacity, the most keys a sequence can have (paged:
//     table_stride * page_size, or less); q, o, lse and the rest as fa2tune_forward's.
//     FaKvCache (fa_params.cuh, inlined below) holds int32 device pointers and two host
//     values: seqlens [batch], the keys each sequence has before this call; batch_idx
//     [batch] or nullptr, the cache row (paged: block-table row) of each batch row;
//     block_table [rows, table_stride] (paged only, nullptr for a contiguous cache), the
//     page of each page_size keys; table_stride; added, the new rows of this call; leftpad
//     [batch] or nullptr (contiguous caches only), each sequence's first key.
//     Sequence b attends to L = min(seqlens[b] + added, nk) keys, causal masks and windows
//     bottom-right aligned at L (query i sees key j iff j <= i + L - nq); with leftpad to
//     keys [leftpad[b], L), counted from leftpad[b] (L - leftpad[b] keys, as FlashAttention's
//     cache_leftpad).
//     append (nullptr: none) gives the new rows, FaKvAppend (kv_append.cuh, inlined below):
//     k_new, v_new [batch, rows, kv_heads, D] with their batch, row and head strides
//     (elements, multiples of 8; 16-byte aligned pointers) and rows == kc.added; its
//     page_size, chunks and reserved are set from the call. Row r of sequence b is written
//     at key seqlens[b] + r, bit for bit, before the attention on the same stream; a row at
//     or past the capacity is dropped. With append nullptr, kc.added keys past seqlens are
//     taken as written already (0 for a plain decode step). var (nullptr: plain attention)
//     is fa2tune_forward_variant's, normalised as a packed batch's (with nq and the
//     capacity: a chunk is kept).
//     The config: the tile the dispatch (with var, the variant dispatch) gives the
//     contiguous call of the same shape with nk the capacity when that is a split-KV config,
//     else the key's split-KV decode default (with var's switches), built as its cache twin
//     for page_size ("_kvc", "_kvc_pg<P>"): fa2tune.torch's rule.
//     Returns cudaErrorInvalidValue for what fa2tune_forward refuses (p checked with nk the
//     capacity, which must be >= 1), a page size this header has no kernels for (not a power
//     of two, or not exported: fa2tune_kvcache_has_page_size), null or misaligned seqlens,
//     batch_idx, leftpad or (paged) block_table, a block table given for a contiguous cache,
//     leftpad given for a paged one,
//     table_stride < ceil(nk / page_size) for a paged one, added < 0 or > nk, an append whose
//     rows are not kc.added or whose pointers or strides are misaligned, a bad variant value;
//     cudaErrorNotSupported for a variant whose switches the header has no kernels of (as
//     fa2tune_forward_variant); otherwise the launches' status. All of these are decided on
//     the host before any launch. Not checked (device memory): the lengths (negative or past
//     the capacity: clamped), the batch indices and the page numbers, which must lie in the
//     caches (an index out of range is an out-of-bounds access), and two sequences sharing a
//     page must not both append into it.
//
//   size_t fa2tune_workspace_size_kvcache(const FaParams& p, const FaKvCache& kc,
//                                         const FaKvAppend* append, int page_size,
//                                         const FaVariant* var, int head_dim,
//                                         fa2tune_dtype dtype, bool causal);
//   cudaError_t fa2tune_forward_kvcache_with_workspace(..., bool causal, void* workspace,
//                                                      size_t workspace_bytes,
//                                                      cudaStream_t stream = 0);
//     fa2tune_workspace_size and fa2tune_forward_with_workspace for a cache call, with the
//     same contract: sized from the capacity, so one zero-filled buffer serves every length
//     (a whole decode loop and its captured graph) while nq, batch, q_heads and kv_heads stay.
//     A buffer that is too small is refused before the append, leaving the cache as it was.
//     Without a workspace the header's own is used (launch once before capturing a graph).
//
//   const char* fa2tune_config_name_kvcache(const FaParams& p, const FaKvCache& kc,
//                                           const FaKvAppend* append, int page_size,
//                                           const FaVariant* var, int head_dim,
//                                           fa2tune_dtype dtype, bool causal);
//     The cache config fa2tune_forward_kvcache would launch (nullptr when it would refuse).
//   bool fa2tune_kvcache_has_page_size(int page_size);
//     Whether the header has cache kernels of that page size (0: contiguous).
//
// Dispatch: on a device whose name (cudaGetDeviceProperties, cached per device) matches the
// GPU this header was tuned for (named above; compared by fa2tune_detail::normalise_name,
// so "NVIDIA H200", "nvidia-h200" and "H200" are one GPU), the config tuned at the shape
// nearest to the call's (nq, nk, batch, q_heads, kv_heads) is used: the smallest sum of
// |ln ratio| of Nq, Nk, the grid fill (ceil(nq / 128) * q_heads * batch blocks over the
// device's SM count, clamped to [1/SMs, 8] waves) and the GQA group q_heads / kv_heads; ties
// go to the longer Nq, then Nk, then the larger batch * heads, then the fewer KV heads
// (fa_shape.cuh; the same rule as fa2tune's store and service, core/shape.py). On other
// GPUs, and for head dims, dtypes or masks without tuned results, FlashAttention-2's default
// config for the head dim is used. A tuned config of the Hopper family (fa3, names
// "fa3_...") is a candidate only where it can run: a GPU of compute capability 9.0, a
// program compiled for sm_90a and parameters TMA can address (fa3::can_launch); the nearest
// of the others is used instead, and the default config when none can run. Split-KV configs
// (splitkv, tuned on decode shapes: few query rows, long keys) run on every sm_80+ target,
// like FlashAttention-2's, and compete by the same shape distance.
//
// Varlen dispatch: packed batches run the varlen (_vl) configs of fa2 and of the Hopper
// family (fa3, names "fa3_..._vl"). On the tuned GPU, the config of the tuned varlen problem
// nearest to the call is used, each batch compared as its
// count of sequences at their mean length, {mean, mean, num_seqs, q_heads, kv_heads}
// (mean = total_q / num_seqs rounded to nearest, ties to even, at least 1:
// fa2tune_shape::varlen_shape, the store's core.shape.varlen_shape), by the distance above;
// key lengths do not enter (the tuned batches are self-attention). As for dense calls, an fa3
// varlen config is a candidate only where it can run (compute capability 9.0, a program
// compiled for sm_90a, strides TMA can address: fa3::can_launch_varlen); the nearest of the
// others is used instead, and the default's varlen twin when none can run. Elsewhere, and
// for head dims, dtypes or masks without tuned varlen results, the varlen twin of
// FlashAttention-2's default config (its tiles, _vl) runs: every (D, dtype, causal) the
// header serves densely it also serves packed.
//
// Variant dispatch: a variant call (after normalisation, see fa2tune_forward_variant) is keyed
// by its head dim, dtype, mask and switches (local, softcap, sinks: core.variant's
// Variant.needs), never by the cap's value or the sink logits, which any config built with
// the switch takes at run time. On the tuned GPU, among the tuned entries of its key whose
// family can run the call (the guards above), the rule is fa2tune's store's
// (core.lookup.pick, C++ twin fa_variant.cuh): the entries tuned at the call's window and
// chunk, else those nearest to them (first the fewest bounds, of left, right and chunk, that
// one side has and the other has not, then the smallest sum of |log2| of the ratios of the
// others, window bounds counted from 1); the variant comes before the shape, so another
// window tuned at this shape loses to this window tuned at another shape. Among those, an
// entry tuned at the call's very shape, else the nearest shape by the distance above (packed
// batches: by count of sequences and mean length, never an exact match), ties to the faster
// (the store's rank: throughput; packed: the first tuned). On other GPUs, and when no tuned
// entry of the key can run, the key's default runs: FlashAttention-2's default config for
// (D, dtype, mask) built with the key's switches (its varlen twin for packed batches); a key
// with no tuned entry has no default either, and the call is refused (cudaErrorNotSupported).
//
// Compiling: C++17, any list of sm_80+ targets. The fa3 kernels (when the header has any)
// exist only in sm_90a code; for other targets they compile to stubs that are never launched:
//   -gencode=arch=compute_90a,code=sm_90a                H100/H200: fa3 and fa2 configs
//   -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_80,code=sm_80
//                                                        the same, plus fa2 on A100, L40, ...
//   -gencode=arch=compute_90,code=sm_90                  fa2 only (fa3 configs -> defaults;
//                                                        fa3 varlen ones -> fa2 varlen ones;
//                                                        fa3 variant ones -> their key's
//                                                        other entries, else its default)
//
// ------------------------------------------------------------------------------------------
// codegen/templates/dispatch.cuh: the exported header's dispatch and launch code. Not a
// header to include on its own: codegen/export.py inlines it (and, in place of its
// #include lines, the kernel templates, the GPU-name rule and the rendered tables) after the
// generated comment with the GPU name and the provenance of every tuned config. Each kernel
// family's part (its HeaderPart.template in codegen/families/: fa2_fwd.cuh,
// fa3_launch.cuh, splitkv_launch.cuh, ...) is inlined only when the header holds a config of
// it, once, in the registry's order: the exporter renders "dispatch_families.inc" as
// their #include lines (a comment for each family left out), and inlines those in turn.
//
// The contract with the rendered table ("dispatch_table.inc", written by the exporter
// from the tuned results; with "dispatch_variants.inc" the only generated C++ in the header;
// fa_shape.cuh, the shape distance, and fa_variant.cuh, the variant rule, are inlined before
// it):
//   - namespace fa2tune_configs: one `using <config name> = <family>::Traits<...>;` per config
//     compiled into the header (tuned winners and defaults), followed by the explicit
//     instantiations of each config's kernel and launcher and its family's guard if any
//     (HeaderPart.instantiations: fa2::fwd_kernel, fa2::launch; fa3::fwd_kernel,
//     fa3::launch, fa3::can_launch; splitkv::fwd_kernel, splitkv::launch; for a varlen
//     config instead: fa2::fwd_varlen_kernel, fa2::launch_varlen; fa3::fwd_varlen_kernel,
//     fa3::launch_varlen, fa3::can_launch_varlen);
//   - in namespace fa2tune_detail:
//       kTunedGpu      the tuned GPU's name, already normalised (normalise_name);
//       kTuned         kTunedCount tables, one per tuned (D, dtype, causal), each with one
//                      choice per tuned problem, carrying the whole shape it was measured at
//                      (every field >= 1), sorted by (nq, nk, batch, heads, kv_heads) and
//                      distinct; a choice's `accepts` is its family's guard, or nullptr
//                      (fa2, splitkv: run wherever the header's code does), and its
//                      `workspace_size` / `launch_with_workspace` are
//                      Workspace<alias>::size / ::launch (nullptr for families that take no
//                      workspace);
//                      kTunedCount may be 0 (one sentinel entry then, never read);
//       kDefaults      kDefaultCount tables, one per supported (D, dtype, causal), each with
//                      one or two choices (shape all 0): FlashAttention-2's default, whose
//                      `accepts` is nullptr, then, for head dims split-KV takes, split-KV's
//                      default fitted to every target's shared memory, which decode steps
//                      (nq <= fa2tune_shape::kDecodeMaxNq) take.
//       kVarlenTuned   kVarlenTunedCount tables like kTuned's for packed batches, of
//                      VarlenChoice: one per tuned varlen problem, its shape the
//                      varlen_shape of its lengths (every field >= 1), sorted and distinct,
//                      its launcher its family's (fa2::launch_varlen<alias>,
//                      fa3::launch_varlen<alias>) and its `accepts` its family's varlen
//                      guard (fa3::can_launch_varlen<alias>) or nullptr (fa2); no
//                      workspace; kVarlenTunedCount may be 0 (one sentinel);
//       kVarlenDefaults kVarlenDefaultCount tables, one per kDefaults entry, each with one
//                      VarlenChoice (shape all 0): the default's varlen twin (fa2, `accepts`
//                      nullptr).
//   Every (D, dtype, causal) of kTuned also has a kDefaults entry, so a tuned shape on another
//   GPU still launches; likewise every kVarlenTuned key has a kVarlenDefaults entry.
// and with the rendered variant tables ("dispatch_variants.inc", after it):
//   - namespace fa2tune_configs: the aliases of the attention-variant configs and the explicit
//     instantiations of their variant kernels and launchers (HeaderPart.instantiations with
//     variant: fa2::fwd_variant_kernel, fa2::launch_variant; fa3::fwd_variant_kernel,
//     fa3::launch_variant, fa3::can_launch; splitkv::fwd_variant_kernel,
//     splitkv::launch_variant; packed: fa2::fwd_varlen_variant_kernel,
//     fa2::launch_varlen_variant; fa3::fwd_varlen_variant_kernel, fa3::launch_varlen_variant,
//     fa3::can_launch_varlen);
//   - in namespace fa2tune_detail:
//       kVariantTuned  kVariantTunedCount tables, one per tuned (D, dtype, causal, local,
//                      softcap, sinks), of VariantChoice: one per tuned variant problem, its
//                      whole shape (every field >= 1), its window_left, window_right and
//                      chunk in the store's form (core.variant.normalize), its rank (0 .. count
//                      - 1, the order of the store's rank: throughput, then median), sorted by
//                      (shape, window_left, window_right, chunk) and distinct; `accepts`,
//                      `workspace_size` and `launch_with_workspace` as kTuned's
//                      (VariantWorkspace<alias>::size / ::launch); kVariantTunedCount may be 0
//                      (one sentinel);
//       kVariantDefaults kVariantDefaultCount tables, one per kVariantTuned or
//                      kVarlenVariantTuned key, each with one VariantChoice (shape all 0):
//                      FlashAttention-2's default with the key's switches (`accepts` nullptr);
//                      kVariantDefaultCount may be 0 (one sentinel);
//       kVarlenVariantTuned, kVarlenVariantDefaults the same for packed batches, of
//                      VarlenVariantChoice (varlen_shape entries, rank the problems' order,
//                      the varlen variant launcher and guard, no workspace; the defaults the
//                      varlen twins of kVariantDefaults', one per key, in the same order).
//   A header of plain results only has both counts 0 and refuses every variant that does
//   not normalise to plain attention.
// and, at the end, "dispatch_kvcache.inc": the #include of kvcache_dispatch.cuh (whose
// own rendered table, "kvcache_table.inc", has its contract at its top) for a header exported
// with page sizes, a comment for one without.
#ifndef FA2TUNE_EXPORTED_HEADER_
#define FA2TUNE_EXPORTED_HEADER_

#include "fa2_fwd.cuh"
#include "fa_abi.cuh"
// Every family with a config in the header, in registry order (generated by the exporter).
#include "dispatch_families.inc"
#include "gpu_name.cuh"
#include "fa_shape.cuh"
#include "fa_variant.cuh"

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

// The parameter struct's name in headers exported before 2026-12-01, kept so that programs
// written against them still compile.
using Fa2Params = FaParams;

// The values are part of the API (stable across exports): never renumber.
enum fa2tune_dtype : int { FA2TUNE_FP16 = 0, FA2TUNE_BF16 = 1 };

namespace fa2tune_detail {

using LaunchFn = cudaError_t (*)(const FaParams&, cudaStream_t);
using AcceptsFn = bool (*)(const FaParams&);
using WorkspaceSizeFn = size_t (*)(const FaParams&);
using LaunchWorkspaceFn = cudaError_t (*)(const FaParams&, void*, size_t, cudaStream_t);

// A config's caller-workspace entry points. A family whose launches can take a caller's
// workspace defines, in its namespace, workspace_hook_size(Traits*, const FaParams&) and
// workspace_hook_launch(Traits*, const FaParams&, void*, size_t, cudaStream_t)
// (splitkv_launch.cuh); argument-dependent lookup on the config's Traits finds them, so the
// table names Workspace<alias>::size / ::launch for every config, whatever its family, and
// they are nullptr where the family defines no hooks (it needs no workspace).
template <class T, class = void>
struct Workspace {
  static constexpr WorkspaceSizeFn size = nullptr;
  static constexpr LaunchWorkspaceFn launch = nullptr;
};

template <class T>
struct Workspace<T, std::void_t<decltype(workspace_hook_size(static_cast<T*>(nullptr),
                                                              std::declval<const FaParams&>()))>> {
  static size_t size_of(const FaParams& p) {
    return workspace_hook_size(static_cast<T*>(nullptr), p);
  }
  static cudaError_t launch_with(const FaParams& p, void* workspace, size_t bytes,
                                 cudaStream_t stream) {
    return workspace_hook_launch(static_cast<T*>(nullptr), p, workspace, bytes, stream);
  }
  static constexpr WorkspaceSizeFn size = &size_of;
  static constexpr LaunchWorkspaceFn launch = &launch_with;
};

struct Choice {
  fa2tune_shape::Shape shape;  // the shape this config was tuned at (all 0 for a default)
  LaunchFn launch;
  const char* name;
  AcceptsFn accepts;  // whether `launch` can run p on the current device; nullptr: always
  WorkspaceSizeFn workspace_size;           // nullptr: the family takes no workspace
  LaunchWorkspaceFn launch_with_workspace;  // nullptr: the family takes no workspace
};

struct Table {
  int d;
  int dtype;  // an fa2tune_dtype value
  bool causal;
  const Choice* choices;  // sorted by shape
  int count;
};

// A packed variable-length config (fa2 or fa3; no family's takes a workspace). The guard sees
// the call as the launcher will (varlen_params' FaParams, the caller's FaVarlen).
using VarlenLaunchFn = cudaError_t (*)(const FaParams&, const FaVarlen&, cudaStream_t);
using VarlenAcceptsFn = bool (*)(const FaParams&, const FaVarlen&);

struct VarlenChoice {
  fa2tune_shape::Shape shape;  // the tuned batch's varlen_shape (all 0 for a default)
  VarlenLaunchFn launch;
  const char* name;
  VarlenAcceptsFn accepts;  // whether `launch` can run here (fa3's guard); nullptr: always
};

struct VarlenTable {
  int d;
  int dtype;  // an fa2tune_dtype value
  bool causal;
  const VarlenChoice* choices;  // sorted by shape
  int count;
};

// Attention-variant configs (a `_loc`, `_cap` or `_snk` switch; docs/variants.md): their
// launchers take FaVariant after the plain arguments. A family whose variant launches can
// take a caller's workspace defines, in its namespace, variant_workspace_hook_size(Traits*,
// const FaParams&) and variant_workspace_hook_launch(Traits*, const FaParams&, const
// FaVariant&, void*, size_t, cudaStream_t) on its variant Traits (splitkv_launch.cuh), found
// by argument-dependent lookup as Workspace's hooks are.
using VariantLaunchFn = cudaError_t (*)(const FaParams&, const FaVariant&, cudaStream_t);
using VariantLaunchWorkspaceFn = cudaError_t (*)(const FaParams&, const FaVariant&, void*,
                                                 size_t, cudaStream_t);

template <class T, class = void>
struct VariantWorkspace {
  static constexpr WorkspaceSizeFn size = nullptr;
  static constexpr VariantLaunchWorkspaceFn launch = nullptr;
};

template <class T>
struct VariantWorkspace<T, std::void_t<decltype(variant_workspace_hook_size(
                               static_cast<T*>(nullptr), std::declval<const FaParams&>()))>> {
  static size_t size_of(const FaParams& p) {
    return variant_workspace_hook_size(static_cast<T*>(nullptr), p);
  }
  static cudaError_t launch_with(const FaParams& p, const FaVariant& var, void* workspace,
                                 size_t bytes, cudaStream_t stream) {
    return variant_workspace_hook_launch(static_cast<T*>(nullptr), p, var, workspace, bytes,
                                         stream);
  }
  static constexpr WorkspaceSizeFn size = &size_of;
  static constexpr VariantLaunchWorkspaceFn launch = &launch_with;
};

// One tuned variant problem's config (or a variant key's default). fa2tune_variant::pick
// reads shape, window_left, window_right, chunk and rank.
struct VariantChoice {
  fa2tune_shape::Shape shape;  // the shape it was tuned at (all 0 for a default)
  int window_left;             // the tuned problem's window and chunk, in the store's form
  int window_right;            // (core.variant.normalize); a default's are -1, -1, 0 and
  int chunk;                   // never compared
  int rank;  // the store's rank among the table's entries: 0 the fastest (throughput)
  VariantLaunchFn launch;
  const char* name;
  AcceptsFn accepts;  // the family's guard (fa3::can_launch: it takes variant configs too)
  WorkspaceSizeFn workspace_size;           // nullptr: the family takes no workspace
  VariantLaunchWorkspaceFn launch_with_workspace;  // nullptr: the family takes no workspace
};

// The tables of one (D, dtype, causal, switches): the mask and switches of the normal form.
struct VariantTable {
  int d;
  int dtype;  // an fa2tune_dtype value
  bool causal;
  bool local;
  bool softcap;
  bool sinks;
  const VariantChoice* choices;  // sorted by (shape, window_left, window_right, chunk)
  int count;
};

using VarlenVariantLaunchFn = cudaError_t (*)(const FaParams&, const FaVarlen&,
                                              const FaVariant&, cudaStream_t);

// A packed variant config (fa2 or fa3 `_vl` with a switch; no workspace).
struct VarlenVariantChoice {
  fa2tune_shape::Shape shape;  // the tuned batch's varlen_shape (all 0 for a default)
  int window_left;
  int window_right;
  int chunk;
  int rank;  // the order the store breaks ties between packed problems in (the first tuned)
  VarlenVariantLaunchFn launch;
  const char* name;
  VarlenAcceptsFn accepts;  // the family's varlen guard, or nullptr
};

struct VarlenVariantTable {
  int d;
  int dtype;
  bool causal;
  bool local;
  bool softcap;
  bool sinks;
  const VarlenVariantChoice* choices;
  int count;
};

}  // namespace fa2tune_detail

#include "dispatch_table.inc"
#include "dispatch_variants.inc"

namespace fa2tune_detail {

// Whether the current device is the tuned GPU. cudaGetDeviceProperties is slow, so each
// device's normalised name is cached per ordinal, and compared with this header's kTunedGpu
// on every call. The cache holds the name, not the answer, because g++ makes an inline
// function's statics one object per process (STB_GNU_UNIQUE), shared by every library built
// from a header like this one, and two such headers may be tuned for different GPUs.
inline bool on_tuned_gpu() {
  constexpr int kMaxDevices = 64;
  constexpr int kNameBytes = 257;  // cudaDeviceProp::name (256) and its terminator
  static char names[kMaxDevices][kNameBytes];
  static std::atomic<int> state[kMaxDevices];  // 0 = empty, 1 = being written, 2 = ready
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  const bool cacheable = dev >= 0 && dev < kMaxDevices;
  if (cacheable && state[dev].load(std::memory_order_acquire) == 2)
    return std::strcmp(names[dev], kTunedGpu) == 0;
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return false;
  char key[sizeof(prop.name) + 1];
  normalise_name(prop.name, key, sizeof(key));
  int empty = 0;
  if (cacheable && sizeof(key) <= static_cast<size_t>(kNameBytes) &&
      state[dev].compare_exchange_strong(empty, 1, std::memory_order_acq_rel)) {
    std::memcpy(names[dev], key, sizeof(key));  // only the claiming thread writes
    state[dev].store(2, std::memory_order_release);
  }
  return std::strcmp(key, kTunedGpu) == 0;
}

// The current device's SM count, for the shape distance's grid-fill term. The attribute is
// cached per device ordinal (0 = not looked up yet); racing threads store the same value.
// Should the query fail, an H100/H200's 132 stands in (the store's default too), uncached.
inline int sm_count() {
  constexpr int kMaxDevices = 64;
  constexpr int kFallback = 132;
  static std::atomic<int> cache[kMaxDevices];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return kFallback;
  const bool cacheable = dev >= 0 && dev < kMaxDevices;
  if (cacheable) {
    const int hit = cache[dev].load(std::memory_order_relaxed);
    if (hit > 0) return hit;
  }
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      sms < 1)
    return kFallback;
  if (cacheable) cache[dev].store(sms, std::memory_order_relaxed);
  return sms;
}

// A call's shape. The ABI allows nk == 0 (no keys: the output is zero), which has no log
// ratio; it counts as nk == 1, the shortest key length a tuned shape can have.
inline fa2tune_shape::Shape call_shape(long long nq, long long nk, long long batch,
                                       long long q_heads, long long kv_heads) {
  return {nq, nk > 1 ? nk : 1, batch, q_heads, kv_heads};
}

// Whether a choice can run p here: its family's guard (fa3::can_launch: compute capability
// 9.0 and an sm_90a image, cached per device; strides TMA can address), if it has one.
inline bool accepts(const Choice& c, const FaParams& p) {
  return c.accepts == nullptr || c.accepts(p);
}

// The index of t's choice nearest to `asked` (fa2tune_shape::nearest), among those that can
// run p when p is given; -1 when none can.
inline int nearest(const Table& t, const fa2tune_shape::Shape& asked, int sms,
                   const FaParams* p, double* distance = nullptr) {
  return fa2tune_shape::nearest(
      asked, t.count, sms,
      [&t, p](int i) -> const fa2tune_shape::Shape* {
        const Choice& c = t.choices[i];
        return p == nullptr || accepts(c, *p) ? &c.shape : nullptr;
      },
      distance);
}

// The tuned table of (D, dtype, causal), or nullptr.
inline const Table* tuned_table(int head_dim, int dtype, bool causal) {
  for (int i = 0; i < kTunedCount; ++i) {
    const Table& t = kTuned[i];
    if (t.d == head_dim && t.dtype == dtype && t.causal == causal) return &t;
  }
  return nullptr;
}

// Tuned tables first (on the tuned GPU only), then the defaults; nullptr for a head dim,
// dtype or mask this header has no config for. Tuned choices that cannot run here (an fa3
// config on a GPU that is not cc 9.0, or in a program built without sm_90a) are passed over
// for the nearest that can; when none can, the default runs (split-KV's for a decode step
// where the key has one). p is valid() here.
inline const Choice* select(const FaParams& p, int head_dim, int dtype, bool causal) {
  // One causal query row sees every key (bottom-right alignment): served as unmasked, where
  // decode is tuned; fa2tune's store, service and PyTorch op apply the same rule.
  if (p.nq == 1) causal = false;
  if (kTunedCount > 0 && on_tuned_gpu()) {
    const Table* t = tuned_table(head_dim, dtype, causal);
    if (t != nullptr) {
      const int i = nearest(*t, call_shape(p.nq, p.nk, p.batch, p.q_heads, p.kv_heads),
                            sm_count(), &p);
      if (i >= 0) return &t->choices[i];
    }
  }
  for (int i = 0; i < kDefaultCount; ++i) {
    const Table& t = kDefaults[i];
    if (t.d != head_dim || t.dtype != dtype || t.causal != causal) continue;
    // A decode step takes the key's split-KV default where it has one (as fa2tune.torch's
    // choice does): FlashAttention-2's tile would spend a 128-row block on one row.
    if (t.count > 1 && p.nq <= fa2tune_shape::kDecodeMaxNq && accepts(t.choices[1], p))
      return &t.choices[1];
    return accepts(t.choices[0], p) ? t.choices : nullptr;
  }
  return nullptr;
}

// The ABI's requirements: 16-byte aligned pointers, strides in multiples of 8 elements
// (the kernel moves 16-byte vectors), whole GQA groups, and grid dimensions CUDA allows.
inline bool valid(const FaParams& p) { return fa2tune_abi::valid(p); }

// The (D, dtype, causal) table among `count` varlen tables, or nullptr.
inline const VarlenTable* find_varlen(const VarlenTable* tables, int count, int head_dim,
                                      int dtype, bool causal) {
  for (int i = 0; i < count; ++i)
    if (tables[i].d == head_dim && tables[i].dtype == dtype && tables[i].causal == causal)
      return &tables[i];
  return nullptr;
}

// A varlen call's shape (fa2tune_shape::varlen_shape of its query rows); p is varlen_params'.
inline fa2tune_shape::Shape varlen_call_shape(const FaParams& p, const FaVarlen& v) {
  return fa2tune_shape::varlen_shape(v.total_q, p.batch, p.q_heads, p.kv_heads);
}

// Whether a varlen choice can run the call here: its family's guard, if it has one.
inline bool accepts_varlen(const VarlenChoice& c, const FaParams& p, const FaVarlen& v) {
  return c.accepts == nullptr || c.accepts(p, v);
}

// The index of t's entry nearest to `asked` (the dense rule, without its phases: a packed
// batch of short sequences is a short prefill), among those that can run the call when p and
// v are given (as nearest); -1 when none can.
inline int nearest_varlen(const VarlenTable& t, const fa2tune_shape::Shape& asked, int sms,
                          const FaParams* p, const FaVarlen* v, double* distance = nullptr) {
  return fa2tune_shape::nearest(
      asked, t.count, sms,
      [&t, p, v](int i) -> const fa2tune_shape::Shape* {
        const VarlenChoice& c = t.choices[i];
        return p == nullptr || v == nullptr || accepts_varlen(c, *p, *v) ? &c.shape : nullptr;
      },
      distance, /*phased=*/false);
}

// The tuned varlen table's nearest entry that can run the call (on the tuned GPU only), else
// the default's varlen twin (fa2: it always can); nullptr for a head dim, dtype or mask this
// header has no config for. p is varlen_params'.
inline const VarlenChoice* select_varlen(const FaParams& p, const FaVarlen& v, int head_dim,
                                         int dtype, bool causal) {
  if (kVarlenTunedCount > 0 && on_tuned_gpu()) {
    const VarlenTable* t = find_varlen(kVarlenTuned, kVarlenTunedCount, head_dim, dtype, causal);
    if (t != nullptr) {
      const int i = nearest_varlen(*t, varlen_call_shape(p, v), sm_count(), &p, &v);
      if (i >= 0) return &t->choices[i];
    }
  }
  const VarlenTable* d = find_varlen(kVarlenDefaults, kVarlenDefaultCount, head_dim, dtype,
                                     causal);
  return d == nullptr || !accepts_varlen(d->choices[0], p, v) ? nullptr : d->choices;
}

// A varlen call's kernel arguments: p with the packed batch's count and longest lengths in
// place of batch, nq and nk, and zero batch strides (the offsets locate every sequence, as
// measure/varlen.py's varlen_params sets them); false when the ABI (valid) or the host-side
// varlen values refuse the call. The offsets are int32 arrays: 4-byte aligned.
inline bool varlen_params(const FaParams& p, const FaVarlen& v, int num_seqs,
                          int max_seqlen_q, int max_seqlen_k, FaParams* out) {
  if (num_seqs < 1 || max_seqlen_q < 1 || max_seqlen_k < 0) return false;
  if (v.cu_seqlens_q == nullptr || v.cu_seqlens_k == nullptr) return false;
  if ((reinterpret_cast<std::uintptr_t>(v.cu_seqlens_q) & 3u) != 0 ||
      (reinterpret_cast<std::uintptr_t>(v.cu_seqlens_k) & 3u) != 0)
    return false;
  if (v.total_q < max_seqlen_q) return false;  // the longest sequence is part of the total
  FaParams s = p;
  s.batch = num_seqs;
  s.nq = max_seqlen_q;
  s.nk = max_seqlen_k;
  s.q_batch_stride = s.k_batch_stride = s.v_batch_stride = s.o_batch_stride = 0;
  if (!valid(s)) return false;
  *out = s;
  return true;
}

// Launches c over p.batch sequences in slices of at most grid z's 65,535, each a later entry
// of the same offset arrays (they hold absolute row numbers, so O and LSE need no offset),
// in order on the stream, as measure/varlen.py's bind_varlen does.
inline cudaError_t launch_varlen_slices(const VarlenChoice& c, const FaParams& p,
                                        const FaVarlen& v, cudaStream_t stream) {
  constexpr int kMaxGridZ = 65535;
  for (int b0 = 0; b0 < p.batch; b0 += kMaxGridZ) {
    FaParams s = p;
    s.batch = p.batch - b0 < kMaxGridZ ? p.batch - b0 : kMaxGridZ;
    FaVarlen sv = v;
    sv.cu_seqlens_q = v.cu_seqlens_q + b0;
    sv.cu_seqlens_k = v.cu_seqlens_k + b0;
    const cudaError_t err = c.launch(s, sv, stream);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace fa2tune_detail

// ------------------------------------------------------------------------------------------
// Public entry points (see the top of this part).

inline const char* fa2tune_config_name(const FaParams& p, int head_dim, fa2tune_dtype dtype,
                                       bool causal) {
  if (!fa2tune_detail::valid(p)) return nullptr;
  const fa2tune_detail::Choice* c =
      fa2tune_detail::select(p, head_dim, static_cast<int>(dtype), causal);
  return c == nullptr ? nullptr : c->name;
}

// The tuned entry the dispatch takes for a shape, found without a device (see the top).
struct fa2tune_tuned_choice {
  int index;         // among the (D, dtype, causal)'s tuned entries, sorted by shape
  const char* name;  // the entry's config
  double distance;   // from the asked shape to the entry's (0: the same shape)
  int nq, nk, batch, q_heads, kv_heads;  // the shape the entry was tuned at
};

namespace fa2tune_detail {

// The answer of fa2tune_nearest_tuned(_varlen): entry i, named `name`, tuned at `s`.
inline fa2tune_tuned_choice tuned_choice(int i, const char* name, double distance,
                                         const fa2tune_shape::Shape& s) {
  return {i,
          name,
          distance,
          static_cast<int>(s.nq),
          static_cast<int>(s.nk),
          static_cast<int>(s.batch),
          static_cast<int>(s.heads),
          static_cast<int>(s.kv_heads)};
}

}  // namespace fa2tune_detail

inline bool fa2tune_nearest_tuned(int head_dim, fa2tune_dtype dtype, bool causal, int nq,
                                  int nk, int batch, int q_heads, int kv_heads, int sm_count,
                                  fa2tune_tuned_choice* out) {
  if (nq < 1 || nk < 0 || batch < 1 || q_heads < 1 || kv_heads < 1 || q_heads % kv_heads != 0)
    return false;
  const fa2tune_detail::Table* t =
      fa2tune_detail::tuned_table(head_dim, static_cast<int>(dtype), causal && nq != 1);
  if (t == nullptr) return false;
  double distance = 0.0;
  const int i = fa2tune_detail::nearest(
      *t, fa2tune_detail::call_shape(nq, nk, batch, q_heads, kv_heads), sm_count, nullptr,
      &distance);
  if (i < 0) return false;
  if (out != nullptr)
    *out = fa2tune_detail::tuned_choice(i, t->choices[i].name, distance, t->choices[i].shape);
  return true;
}

namespace fa2tune_detail {
// The split-Q families (fa2, fa3) put the batch in grid z, which stops at 65,535 blocks: a
// larger batch is launched as slices of at most that many sequences, in order on the stream
// (the split-KV family puts batch x heads in grid x and launches whole). Every element type
// the table holds is 2 bytes wide.
// `whole`: the family launches any batch at once (a split-KV config). Sink logits are per
// head, so a slice keeps the caller's.
template <class Launch>
inline cudaError_t in_batch_slices(const FaParams& p, bool whole, Launch&& launch) {
  constexpr int kMaxGridZ = 65535;
  if (whole || p.batch <= kMaxGridZ) return launch(p);
  for (int b0 = 0; b0 < p.batch; b0 += kMaxGridZ) {
    FaParams s = p;
    s.batch = p.batch - b0 < kMaxGridZ ? p.batch - b0 : kMaxGridZ;
    s.q = static_cast<const char*>(p.q) + 2 * b0 * p.q_batch_stride;
    s.k = static_cast<const char*>(p.k) + 2 * b0 * p.k_batch_stride;
    s.v = static_cast<const char*>(p.v) + 2 * b0 * p.v_batch_stride;
    s.o = static_cast<char*>(p.o) + 2 * b0 * p.o_batch_stride;
    if (p.lse != nullptr) s.lse = p.lse + static_cast<int64_t>(b0) * p.q_heads * p.nq;
    const cudaError_t err = launch(static_cast<const FaParams&>(s));
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

inline cudaError_t launch_batch_slices(const Choice& c, const FaParams& p, cudaStream_t stream) {
  return in_batch_slices(p, c.workspace_size != nullptr,
                         [&c, stream](const FaParams& s) { return c.launch(s, stream); });
}
}  // namespace fa2tune_detail

inline cudaError_t fa2tune_forward(const FaParams& p, int head_dim, fa2tune_dtype dtype,
                                   bool causal, cudaStream_t stream = 0) {
  if (!fa2tune_detail::valid(p)) return cudaErrorInvalidValue;
  const fa2tune_detail::Choice* c =
      fa2tune_detail::select(p, head_dim, static_cast<int>(dtype), causal);
  if (c == nullptr) return cudaErrorInvalidValue;
  return fa2tune_detail::launch_batch_slices(*c, p, stream);
}

// Scratch bytes the config fa2tune_forward would launch here needs (see the top).
inline size_t fa2tune_workspace_size(const FaParams& p, int head_dim, fa2tune_dtype dtype,
                                     bool causal) {
  if (!fa2tune_detail::valid(p)) return 0;
  const fa2tune_detail::Choice* c =
      fa2tune_detail::select(p, head_dim, static_cast<int>(dtype), causal);
  return c == nullptr || c->workspace_size == nullptr ? 0 : c->workspace_size(p);
}

// fa2tune_forward with the caller's workspace (contract: see the top).
inline cudaError_t fa2tune_forward_with_workspace(const FaParams& p, int head_dim,
                                                  fa2tune_dtype dtype, bool causal,
                                                  void* workspace, size_t workspace_bytes,
                                                  cudaStream_t stream = 0) {
  if (!fa2tune_detail::valid(p)) return cudaErrorInvalidValue;
  const fa2tune_detail::Choice* c =
      fa2tune_detail::select(p, head_dim, static_cast<int>(dtype), causal);
  if (c == nullptr) return cudaErrorInvalidValue;
  if (c->launch_with_workspace == nullptr) return fa2tune_detail::launch_batch_slices(*c, p, stream);
  return c->launch_with_workspace(p, workspace, workspace_bytes, stream);
}

// ------------------------------------------------------------------------------------------
// Packed variable-length entry points (see the top).

inline const char* fa2tune_config_name_varlen(const FaParams& p, const FaVarlen& v,
                                              int num_seqs, int max_seqlen_q, int max_seqlen_k,
                                              int head_dim, fa2tune_dtype dtype, bool causal) {
  FaParams s{};
  if (!fa2tune_detail::varlen_params(p, v, num_seqs, max_seqlen_q, max_seqlen_k, &s))
    return nullptr;
  const fa2tune_detail::VarlenChoice* c =
      fa2tune_detail::select_varlen(s, v, head_dim, static_cast<int>(dtype), causal);
  return c == nullptr ? nullptr : c->name;
}

inline cudaError_t fa2tune_forward_varlen(const FaParams& p, const FaVarlen& v, int num_seqs,
                                          int max_seqlen_q, int max_seqlen_k, int head_dim,
                                          fa2tune_dtype dtype, bool causal,
                                          cudaStream_t stream = 0) {
  FaParams s{};
  if (!fa2tune_detail::varlen_params(p, v, num_seqs, max_seqlen_q, max_seqlen_k, &s))
    return cudaErrorInvalidValue;
  const fa2tune_detail::VarlenChoice* c =
      fa2tune_detail::select_varlen(s, v, head_dim, static_cast<int>(dtype), causal);
  if (c == nullptr) return cudaErrorInvalidValue;
  return fa2tune_detail::launch_varlen_slices(*c, s, v, stream);
}

// The tuned varlen entry a packed batch gets, found without a device (see the top).
inline bool fa2tune_nearest_tuned_varlen(int head_dim, fa2tune_dtype dtype, bool causal,
                                         int num_seqs, int total_q, int q_heads, int kv_heads,
                                         int sm_count, fa2tune_tuned_choice* out) {
  if (num_seqs < 1 || total_q < 0 || q_heads < 1 || kv_heads < 1 || q_heads % kv_heads != 0)
    return false;
  const fa2tune_detail::VarlenTable* t =
      fa2tune_detail::find_varlen(fa2tune_detail::kVarlenTuned, fa2tune_detail::kVarlenTunedCount,
                                  head_dim, static_cast<int>(dtype), causal);
  if (t == nullptr) return false;
  double distance = 0.0;
  const int i = fa2tune_detail::nearest_varlen(
      *t, fa2tune_shape::varlen_shape(total_q, num_seqs, q_heads, kv_heads), sm_count, nullptr,
      nullptr, &distance);
  if (i < 0) return false;
  if (out != nullptr)
    *out = fa2tune_detail::tuned_choice(i, t->choices[i].name, distance, t->choices[i].shape);
  return true;
}

// ------------------------------------------------------------------------------------------
// Attention-variant entry points (see the top).

namespace fa2tune_detail {

// The variant values the API takes (cudaErrorInvalidValue otherwise): window bounds of -1
// (none) or more, a chunk of 0 (none) or more, a softcap of 0 (none) or a finite value above
// it, a sinks pointer aligned for float (null: no sinks; FaVariant has no other sinks flag).
inline bool valid_variant(const FaVariant& var) {
  if (var.window_left < -1 || var.window_right < -1 || var.chunk < 0) return false;
  if (!(var.softcap >= 0.f) || std::isinf(var.softcap)) return false;
  return (reinterpret_cast<std::uintptr_t>(var.sinks) & 3u) == 0;
}

// A dense call's variant in the store's form (core.variant.normalize with its lengths).
inline fa2tune_variant::Normal dense_variant(const FaVariant& var, bool causal, long long nq,
                                             long long nk) {
  return fa2tune_variant::normalize(causal, var.window_left, var.window_right, var.chunk,
                                    var.softcap > 0.f, var.sinks != nullptr, nq, nk);
}

// A packed batch's (fa2tune_variant::normalize_packed with its longest lengths).
inline fa2tune_variant::Normal packed_variant(const FaVariant& var, bool causal,
                                              long long max_q, long long max_k) {
  return fa2tune_variant::normalize_packed(causal, var.window_left, var.window_right,
                                           var.chunk, var.softcap > 0.f, var.sinks != nullptr,
                                           max_q, max_k);
}

// What the chosen kernel is given: the normal form's window and chunk, with a causal
// config's right bound 0 (the kernels' local mask takes causality as that bound, where the
// store's form says plain causal as no window: measure.params.launch_variant), and the
// caller's cap and sink logits.
inline FaVariant kernel_variant(const fa2tune_variant::Normal& n, const FaVariant& var) {
  FaVariant k = var;
  k.window_left = n.window_left;
  k.window_right = n.causal ? 0 : n.window_right;
  k.chunk = n.chunk;
  return k;
}

// The table of (D, dtype) and n's mask and switches among `count`, or nullptr.
template <class Table>
inline const Table* find_variant(const Table* tables, int count, int head_dim, int dtype,
                                 const fa2tune_variant::Normal& n) {
  for (int i = 0; i < count; ++i) {
    const Table& t = tables[i];
    if (t.d == head_dim && t.dtype == dtype && t.causal == n.causal && t.local == n.local() &&
        t.softcap == n.softcap && t.sinks == n.sinks)
      return &t;
  }
  return nullptr;
}

inline bool accepts_variant(const VariantChoice& c, const FaParams& p) {
  return c.accepts == nullptr || c.accepts(p);
}

inline bool accepts_varlen_variant(const VarlenVariantChoice& c, const FaParams& p,
                                   const FaVarlen& v) {
  return c.accepts == nullptr || c.accepts(p, v);
}

// On the tuned GPU (`tuned`, with `sms` SMs), core.lookup.pick's entry among the tuned
// entries of the call's key that can run p here; else (another GPU, nothing tuned can run)
// the key's default, FlashAttention-2's default config with the key's switches; nullptr when
// the header has no config of the key (its switches were not tuned at this D, dtype and
// mask). n is not plain; p is valid().
inline const VariantChoice* select_variant_on(const FaParams& p, const fa2tune_variant::Normal& n,
                                              int head_dim, int dtype, bool tuned, int sms) {
  const VariantTable* t = find_variant(kVariantTuned, kVariantTunedCount, head_dim, dtype, n);
  if (t != nullptr && tuned) {
    const fa2tune_variant::Found f = fa2tune_variant::pick(
        t->choices, t->count, call_shape(p.nq, p.nk, p.batch, p.q_heads, p.kv_heads), n, sms,
        false, [t, &p](int i) { return accepts_variant(t->choices[i], p); });
    if (f.index >= 0) return &t->choices[f.index];
  }
  const VariantTable* d =
      find_variant(kVariantDefaults, kVariantDefaultCount, head_dim, dtype, n);
  return d == nullptr || !accepts_variant(d->choices[0], p) ? nullptr : d->choices;
}

// select_variant_on here: the tuned GPU when the current device is it, its SM count.
inline const VariantChoice* select_variant(const FaParams& p, const fa2tune_variant::Normal& n,
                                           int head_dim, int dtype) {
  const bool tuned = kVariantTunedCount > 0 && on_tuned_gpu();
  return select_variant_on(p, n, head_dim, dtype, tuned, tuned ? sm_count() : 0);
}

// The packed twin of select_variant_on: the tuned packed entries (the batch compared as its
// count of sequences at their mean length), else the default's varlen twin. p is
// varlen_params'.
inline const VarlenVariantChoice* select_varlen_variant_on(const FaParams& p, const FaVarlen& v,
                                                           const fa2tune_variant::Normal& n,
                                                           int head_dim, int dtype, bool tuned,
                                                           int sms) {
  const VarlenVariantTable* t =
      find_variant(kVarlenVariantTuned, kVarlenVariantTunedCount, head_dim, dtype, n);
  if (t != nullptr && tuned) {
    const fa2tune_variant::Found f = fa2tune_variant::pick(
        t->choices, t->count, varlen_call_shape(p, v), n, sms, true,
        [t, &p, &v](int i) { return accepts_varlen_variant(t->choices[i], p, v); });
    if (f.index >= 0) return &t->choices[f.index];
  }
  const VarlenVariantTable* d =
      find_variant(kVarlenVariantDefaults, kVarlenVariantDefaultCount, head_dim, dtype, n);
  return d == nullptr || !accepts_varlen_variant(d->choices[0], p, v) ? nullptr : d->choices;
}

inline const VarlenVariantChoice* select_varlen_variant(const FaParams& p, const FaVarlen& v,
                                                        const fa2tune_variant::Normal& n,
                                                        int head_dim, int dtype) {
  const bool tuned = kVarlenVariantTunedCount > 0 && on_tuned_gpu();
  return select_varlen_variant_on(p, v, n, head_dim, dtype, tuned, tuned ? sm_count() : 0);
}

}  // namespace fa2tune_detail

inline const char* fa2tune_config_name_variant(const FaParams& p, const FaVariant& var,
                                               int head_dim, fa2tune_dtype dtype, bool causal) {
  if (!fa2tune_detail::valid(p) || !fa2tune_detail::valid_variant(var)) return nullptr;
  const fa2tune_variant::Normal n = fa2tune_detail::dense_variant(var, causal, p.nq, p.nk);
  if (n.plain()) return fa2tune_config_name(p, head_dim, dtype, n.causal);
  const fa2tune_detail::VariantChoice* c =
      fa2tune_detail::select_variant(p, n, head_dim, static_cast<int>(dtype));
  return c == nullptr ? nullptr : c->name;
}

inline cudaError_t fa2tune_forward_variant(const FaParams& p, const FaVariant& var, int head_dim,
                                           fa2tune_dtype dtype, bool causal,
                                           cudaStream_t stream = 0) {
  if (!fa2tune_detail::valid(p) || !fa2tune_detail::valid_variant(var))
    return cudaErrorInvalidValue;
  const fa2tune_variant::Normal n = fa2tune_detail::dense_variant(var, causal, p.nq, p.nk);
  if (n.plain()) return fa2tune_forward(p, head_dim, dtype, n.causal, stream);
  const fa2tune_detail::VariantChoice* c =
      fa2tune_detail::select_variant(p, n, head_dim, static_cast<int>(dtype));
  if (c == nullptr) return cudaErrorNotSupported;
  const FaVariant k = fa2tune_detail::kernel_variant(n, var);
  return fa2tune_detail::in_batch_slices(
      p, c->workspace_size != nullptr,
      [c, &k, stream](const FaParams& s) { return c->launch(s, k, stream); });
}

// Scratch bytes the config fa2tune_forward_variant would launch here needs (see the top).
inline size_t fa2tune_workspace_size_variant(const FaParams& p, const FaVariant& var,
                                             int head_dim, fa2tune_dtype dtype, bool causal) {
  if (!fa2tune_detail::valid(p) || !fa2tune_detail::valid_variant(var)) return 0;
  const fa2tune_variant::Normal n = fa2tune_detail::dense_variant(var, causal, p.nq, p.nk);
  if (n.plain()) return fa2tune_workspace_size(p, head_dim, dtype, n.causal);
  const fa2tune_detail::VariantChoice* c =
      fa2tune_detail::select_variant(p, n, head_dim, static_cast<int>(dtype));
  return c == nullptr || c->workspace_size == nullptr ? 0 : c->workspace_size(p);
}

// fa2tune_forward_variant with the caller's workspace (fa2tune_forward_with_workspace's
// contract).
inline cudaError_t fa2tune_forward_variant_with_workspace(const FaParams& p,
                                                          const FaVariant& var, int head_dim,
                                                          fa2tune_dtype dtype, bool causal,
                                                          void* workspace,
                                                          size_t workspace_bytes,
                                                          cudaStream_t stream = 0) {
  if (!fa2tune_detail::valid(p) || !fa2tune_detail::valid_variant(var))
    return cudaErrorInvalidValue;
  const fa2tune_variant::Normal n = fa2tune_detail::dense_variant(var, causal, p.nq, p.nk);
  if (n.plain())
    return fa2tune_forward_with_workspace(p, head_dim, dtype, n.causal, workspace,
                                          workspace_bytes, stream);
  const fa2tune_detail::VariantChoice* c =
      fa2tune_detail::select_variant(p, n, head_dim, static_cast<int>(dtype));
  if (c == nullptr) return cudaErrorNotSupported;
  const FaVariant k = fa2tune_detail::kernel_variant(n, var);
  if (c->launch_with_workspace == nullptr)
    return fa2tune_detail::in_batch_slices(
        p, c->workspace_size != nullptr,
        [c, &k, stream](const FaParams& s) { return c->launch(s, k, stream); });
  return c->launch_with_workspace(p, k, workspace, workspace_bytes, stream);
}

// The tuned variant entry a call gets, found without a device (see the top).
struct fa2tune_tuned_variant_choice {
  int index;         // among the tuned entries of the call's (D, dtype, mask, switches)
  const char* name;  // the entry's config
  double distance;   // from the asked shape to the entry's (0: the same shape)
  int nq, nk, batch, q_heads, kv_heads;  // the shape the entry was tuned at
  bool causal;                           // the mask the call is served as
  int window_left, window_right, chunk;  // the entry's window and chunk (store's form)
  bool same_variant;  // the entry's window and chunk are the call's (normalised)
};

namespace fa2tune_detail {

// The answer for a variant that normalises to plain attention: the plain entry.
inline fa2tune_tuned_variant_choice plain_variant_choice(const fa2tune_tuned_choice& c,
                                                         bool causal) {
  return {c.index, c.name, c.distance, c.nq, c.nk, c.batch, c.q_heads, c.kv_heads,
          causal,  -1,     -1,         0,    true};
}

template <class Choice>
inline fa2tune_tuned_variant_choice variant_choice(int i, const Choice& c, double distance,
                                                   bool causal, bool same) {
  return {i,
          c.name,
          distance,
          static_cast<int>(c.shape.nq),
          static_cast<int>(c.shape.nk),
          static_cast<int>(c.shape.batch),
          static_cast<int>(c.shape.heads),
          static_cast<int>(c.shape.kv_heads),
          causal,
          c.window_left,
          c.window_right,
          c.chunk,
          same};
}

}  // namespace fa2tune_detail

inline bool fa2tune_nearest_tuned_variant(const FaVariant& var, int head_dim,
                                          fa2tune_dtype dtype, bool causal, int nq, int nk,
                                          int batch, int q_heads, int kv_heads, int sm_count,
                                          fa2tune_tuned_variant_choice* out) {
  if (nq < 1 || nk < 0 || batch < 1 || q_heads < 1 || kv_heads < 1 || q_heads % kv_heads != 0)
    return false;
  if (!fa2tune_detail::valid_variant(var)) return false;
  const fa2tune_variant::Normal n = fa2tune_detail::dense_variant(var, causal, nq, nk);
  if (n.plain()) {
    fa2tune_tuned_choice c{};
    if (!fa2tune_nearest_tuned(head_dim, dtype, n.causal, nq, nk, batch, q_heads, kv_heads,
                               sm_count, &c))
      return false;
    if (out != nullptr) *out = fa2tune_detail::plain_variant_choice(c, n.causal);
    return true;
  }
  const fa2tune_detail::VariantTable* t = fa2tune_detail::find_variant(
      fa2tune_detail::kVariantTuned, fa2tune_detail::kVariantTunedCount, head_dim,
      static_cast<int>(dtype), n);
  if (t == nullptr) return false;
  const fa2tune_variant::Found f = fa2tune_variant::pick(
      t->choices, t->count, fa2tune_detail::call_shape(nq, nk, batch, q_heads, kv_heads), n,
      sm_count, false, [](int) { return true; });
  if (f.index < 0) return false;
  if (out != nullptr)
    *out = fa2tune_detail::variant_choice(f.index, t->choices[f.index], f.distance, n.causal,
                                          f.same_variant);
  return true;
}

// ------------------------------------------------------------------------------------------
// Packed variable-length attention-variant entry points (see the top).

inline const char* fa2tune_config_name_varlen_variant(const FaParams& p, const FaVarlen& v,
                                                      const FaVariant& var, int num_seqs,
                                                      int max_seqlen_q, int max_seqlen_k,
                                                      int head_dim, fa2tune_dtype dtype,
                                                      bool causal) {
  FaParams s{};
  if (!fa2tune_detail::varlen_params(p, v, num_seqs, max_seqlen_q, max_seqlen_k, &s))
    return nullptr;
  if (!fa2tune_detail::valid_variant(var)) return nullptr;
  const fa2tune_variant::Normal n =
      fa2tune_detail::packed_variant(var, causal, max_seqlen_q, max_seqlen_k);
  if (n.plain())
    return fa2tune_config_name_varlen(p, v, num_seqs, max_seqlen_q, max_seqlen_k, head_dim,
                                      dtype, n.causal);
  const fa2tune_detail::VarlenVariantChoice* c =
      fa2tune_detail::select_varlen_variant(s, v, n, head_dim, static_cast<int>(dtype));
  return c == nullptr ? nullptr : c->name;
}

inline cudaError_t fa2tune_forward_varlen_variant(const FaParams& p, const FaVarlen& v,
                                                  const FaVariant& var, int num_seqs,
                                                  int max_seqlen_q, int max_seqlen_k,
                                                  int head_dim, fa2tune_dtype dtype,
                                                  bool causal, cudaStream_t stream = 0) {
  FaParams s{};
  if (!fa2tune_detail::varlen_params(p, v, num_seqs, max_seqlen_q, max_seqlen_k, &s))
    return cudaErrorInvalidValue;
  if (!fa2tune_detail::valid_variant(var)) return cudaErrorInvalidValue;
  const fa2tune_variant::Normal n =
      fa2tune_detail::packed_variant(var, causal, max_seqlen_q, max_seqlen_k);
  if (n.plain())
    return fa2tune_forward_varlen(p, v, num_seqs, max_seqlen_q, max_seqlen_k, head_dim, dtype,
                                  n.causal, stream);
  const fa2tune_detail::VarlenVariantChoice* c =
      fa2tune_detail::select_varlen_variant(s, v, n, head_dim, static_cast<int>(dtype));
  if (c == nullptr) return cudaErrorNotSupported;
  const FaVariant k = fa2tune_detail::kernel_variant(n, var);
  constexpr int kMaxGridZ = 65535;  // as launch_varlen_slices
  for (int b0 = 0; b0 < s.batch; b0 += kMaxGridZ) {
    FaParams slice = s;
    slice.batch = s.batch - b0 < kMaxGridZ ? s.batch - b0 : kMaxGridZ;
    FaVarlen sv = v;
    sv.cu_seqlens_q = v.cu_seqlens_q + b0;
    sv.cu_seqlens_k = v.cu_seqlens_k + b0;
    const cudaError_t err = c->launch(slice, sv, k, stream);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

inline bool fa2tune_nearest_tuned_varlen_variant(const FaVariant& var, int head_dim,
                                                 fa2tune_dtype dtype, bool causal,
                                                 int num_seqs, int total_q, int max_seqlen_q,
                                                 int max_seqlen_k, int q_heads, int kv_heads,
                                                 int sm_count,
                                                 fa2tune_tuned_variant_choice* out) {
  if (num_seqs < 1 || total_q < 0 || max_seqlen_q < 1 || max_seqlen_k < 0 || q_heads < 1 ||
      kv_heads < 1 || q_heads % kv_heads != 0)
    return false;
  if (!fa2tune_detail::valid_variant(var)) return false;
  const fa2tune_variant::Normal n =
      fa2tune_detail::packed_variant(var, causal, max_seqlen_q, max_seqlen_k);
  if (n.plain()) {
    fa2tune_tuned_choice c{};
    if (!fa2tune_nearest_tuned_varlen(head_dim, dtype, n.causal, num_seqs, total_q, q_heads,
                                      kv_heads, sm_count, &c))
      return false;
    if (out != nullptr) *out = fa2tune_detail::plain_variant_choice(c, n.causal);
    return true;
  }
  const fa2tune_detail::VarlenVariantTable* t = fa2tune_detail::find_variant(
      fa2tune_detail::kVarlenVariantTuned, fa2tune_detail::kVarlenVariantTunedCount, head_dim,
      static_cast<int>(dtype), n);
  if (t == nullptr) return false;
  const fa2tune_variant::Found f = fa2tune_variant::pick(
      t->choices, t->count, fa2tune_shape::varlen_shape(total_q, num_seqs, q_heads, kv_heads),
      n, sm_count, true, [](int) { return true; });
  if (f.index < 0) return false;
  if (out != nullptr)
    *out = fa2tune_detail::variant_choice(f.index, t->choices[f.index], f.distance, n.causal,
                                          f.same_variant);
  return true;
}

// The KV-cache entry points (fa2tune_forward_kvcache and its twins): the exporter renders this
// include as that of kvcache_dispatch.cuh for a header exported with page sizes (--kv-pages),
// and as a comment otherwise.
#include "dispatch_kvcache.inc"

#endif  // FA2TUNE_EXPORTED_HEADER_
