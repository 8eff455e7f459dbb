/* tokenizer: the kind-independent half of moe/tokenizer.h - option validation, the spec
 * JSON (write and rebuild), the vocabulary hash, the table of kinds (name, build, encode,
 * decode) and encode/decode for the kinds with one token per base (byte, nuc). The kinds'
 * vocabularies live in tokenizers/.
 *
 * The one thing to know: the spec JSON is canonical (jansson, sorted keys, compact), so the
 * same options always give the same bytes in every shard. */
#include "moe/tokenizer.h"

#include <ctype.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

static const char *const CASE_NAMES[] = {"keep", "upper", "upper+mask"};
static const char *const IUPAC_NAMES[] = {"keep", "to-n", "drop"};
static const char *const NRUN_NAMES[] = {"keep", "collapse", "split"};
static const char *const RC_NAMES[] = {"none", "add", "random"};

static int parse_name(const char *s, const char *const *names, int n) {
    for (int i = 0; s && i < n; i++)
        if (strcmp(s, names[i]) == 0) return i;
    return -1;
}

const char *moe_case_policy_name(moe_case_policy p) {
    return CASE_NAMES[p];
}
const char *moe_iupac_policy_name(moe_iupac_policy p) {
    return IUPAC_NAMES[p];
}
const char *moe_nrun_policy_name(moe_nrun_policy p) {
    return NRUN_NAMES[p];
}
const char *moe_revcomp_policy_name(moe_revcomp_policy p) {
    return RC_NAMES[p];
}
int moe_case_policy_parse(const char *s) {
    return parse_name(s, CASE_NAMES, 3);
}
int moe_iupac_policy_parse(const char *s) {
    return parse_name(s, IUPAC_NAMES, 3);
}
int moe_nrun_policy_parse(const char *s) {
    return parse_name(s, NRUN_NAMES, 3);
}
int moe_revcomp_policy_parse(const char *s) {
    return parse_name(s, RC_NAMES, 3);
}

/* ---- the kinds ---- */

static moe_status encode_per_base(const moe_tokenizer *t, const char *seq, int64_t len,
                                  moe_token_buf *out, moe_err *err);
static int64_t decode_per_base(const moe_tokenizer *t, const int32_t *ids, const uint8_t *lower,
                               int64_t n, char *out);

/* Every kind once: what the command line and the spec call it, and its functions. */
static const moe_tok_kind KINDS[] = {
    {MOE_TOKENIZER_BYTE, "byte", moe_tok_byte_build, encode_per_base, decode_per_base},
    {MOE_TOKENIZER_NUC, "nuc", moe_tok_nuc_build, encode_per_base, decode_per_base},
    {MOE_TOKENIZER_KMER, "kmer", moe_tok_kmer_build, moe_tok_kmer_encode, moe_tok_kmer_decode},
};

/* The table entry of a kind; NULL for a value that is not one. */
static const moe_tok_kind *kind_find(moe_tokenizer_kind kind) {
    for (size_t i = 0; i < sizeof KINDS / sizeof KINDS[0]; i++)
        if (KINDS[i].kind == kind) return &KINDS[i];
    return NULL;
}

int moe_tokenizer_kind_parse(const char *s) {
    for (size_t i = 0; s && i < sizeof KINDS / sizeof KINDS[0]; i++)
        if (strcmp(s, KINDS[i].name) == 0) return (int)KINDS[i].kind;
    return -1;
}

void moe_tokenizer_opts_defaults(moe_tokenizer_opts *o, moe_tokenizer_kind kind) {
    memset(o, 0, sizeof *o);
    o->kind = kind;
    o->vocab_size = kind == MOE_TOKENIZER_BYTE ? 256 : 0;
    o->k = kind == MOE_TOKENIZER_KMER ? 6 : 0;
    o->case_policy = kind == MOE_TOKENIZER_KMER ? MOE_CASE_UPPER : MOE_CASE_KEEP;
    o->iupac = kind == MOE_TOKENIZER_KMER ? MOE_IUPAC_TO_N : MOE_IUPAC_KEEP;
    o->nrun = MOE_NRUN_KEEP;
    o->revcomp = MOE_REVCOMP_NONE;
    o->min_length = 1;
    o->add_eos = 1;
}

char moe_tok_resolve_base(const moe_tokenizer_opts *o, unsigned char c, int *lower) {
    *lower = 0;
    if (c >= 128 || !isalpha(c)) return 0;
    int lo = islower(c) != 0;
    char u = (char)toupper(c);
    if (!strchr("ACGTN", u)) {
        if (!strchr("RYSWKMBDHVU", u)) return 0;
        if (o->iupac == MOE_IUPAC_TO_N)
            u = u == 'U' ? 'T' : 'N';
        else if (o->iupac == MOE_IUPAC_DROP) {
            if (u != 'U') return 1;
            u = 'T';
        }
    }
    if (o->case_policy == MOE_CASE_KEEP) return lo ? (char)tolower((unsigned char)u) : u;
    if (o->case_policy == MOE_CASE_UPPER_MASK) *lower = lo;
    return u;
}

moe_status moe_tok_alloc_vocab(moe_tokenizer *t, int64_t n, moe_err *err) {
    t->vocab = calloc((size_t)n, sizeof *t->vocab);
    if (!t->vocab) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory (vocabulary)");
    t->vocab_size = n;
    return MOE_OK;
}

moe_status moe_tok_set_vocab(moe_tokenizer *t, int64_t i, const char *s, moe_err *err) {
    t->vocab[i] = strdup(s);
    if (!t->vocab[i]) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory (vocabulary)");
    return MOE_OK;
}

moe_status moe_tok_set_nt_specials(moe_tokenizer *t, moe_err *err) {
    static const char *const special[MOE_TOK_N_SPECIAL] = {"<pad>", "<bos>", "<eos>", "<mask>",
                                                           "<unk>"};
    t->pad_id = 0;
    t->bos_id = 1;
    t->eos_id = 2;
    t->mask_id = 3;
    t->unk_id = 4;
    for (int i = 0; i < MOE_TOK_N_SPECIAL; i++)
        if (moe_tok_set_vocab(t, i, special[i], err) != MOE_OK) return MOE_ERR_RUNTIME;
    return MOE_OK;
}

void moe_tok_fill_enc(moe_tokenizer *t, const char *alphabet, int first_id) {
    for (int c = 0; c < 256; c++) {
        int lower;
        char b = moe_tok_resolve_base(&t->opts, (unsigned char)c, &lower);
        const char *p = b > 1 && alphabet ? strchr(alphabet, b) : NULL;
        t->enc[c] = b == 0      ? MOE_TOK_BAD
                    : b == 1    ? MOE_TOK_DROP
                    : !alphabet ? (int16_t)(unsigned char)b
                    : p         ? (int16_t)(first_id + (p - alphabet))
                                : MOE_TOK_BAD;
        t->enc_lower[c] = (uint8_t)lower;
        t->enc_is_n[c] = b == 'N' || b == 'n';
    }
}

static moe_status validate_opts(const moe_tokenizer_opts *o, moe_err *err) {
    const char *why = NULL;
    char buf[200];
    if (!kind_find(o->kind))
        why = "unknown tokenizer (expected byte, nuc or kmer)";
    else if ((unsigned)o->case_policy > 2 || (unsigned)o->iupac > 2 || (unsigned)o->nrun > 2 ||
             (unsigned)o->revcomp > 2)
        why = "unknown policy value";
    else if (o->kind == MOE_TOKENIZER_BYTE && o->vocab_size != 256 && o->vocab_size != 512) {
        snprintf(buf, sizeof buf, "byte tokenizer vocabulary must be 256 or 512, not %lld",
                 (long long)o->vocab_size);
        why = buf;
    } else if (o->kind != MOE_TOKENIZER_BYTE && o->vocab_size != 0)
        why = "only the byte tokenizer takes a vocabulary size";
    else if (o->kind == MOE_TOKENIZER_KMER && (o->k < 1 || o->k > 8)) {
        snprintf(buf, sizeof buf, "kmer k must be 1..8, not %d", o->k);
        why = buf;
    } else if (o->kind != MOE_TOKENIZER_KMER && o->k != 0)
        why = "only the kmer tokenizer takes k";
    else if (o->kind == MOE_TOKENIZER_KMER && o->case_policy == MOE_CASE_KEEP)
        why = "the kmer vocabulary has no lower-case tokens: use case upper or upper+mask";
    else if (o->kind == MOE_TOKENIZER_KMER && o->iupac == MOE_IUPAC_KEEP)
        why = "the kmer vocabulary has no IUPAC tokens: use iupac to-n or drop";
    else if (o->window < 0 || o->stride < 0 || o->min_length < 0)
        why = "window, stride and min-length must not be negative";
    else if (o->stride > 0 && o->window == 0)
        why = "a stride needs a window";
    if (why) {
        moe_err_set(err, MOE_ERR_INPUT, NULL, "invalid tokenizer options: %s", why);
        return MOE_ERR_INPUT;
    }
    return MOE_OK;
}

static uint64_t vocab_hash(const moe_tokenizer *t) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a 64 over "tok\n" for every token */
    for (int64_t i = 0; i < t->vocab_size; i++) {
        for (const unsigned char *p = (const unsigned char *)t->vocab[i]; *p; p++) {
            h ^= *p;
            h *= 1099511628211ULL;
        }
        h ^= '\n';
        h *= 1099511628211ULL;
    }
    return h;
}

static moe_status build_spec(moe_tokenizer *t, moe_err *err) {
    const moe_tokenizer_opts *o = &t->opts;
    char hash[32];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)t->vocab_hash);
    json_t *pol =
        json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:b, s:b}", "case",
                  CASE_NAMES[o->case_policy], "iupac", IUPAC_NAMES[o->iupac], "n_runs",
                  NRUN_NAMES[o->nrun], "revcomp", RC_NAMES[o->revcomp], "seed", (json_int_t)o->seed,
                  "window", (json_int_t)o->window, "stride", (json_int_t)o->stride, "min_length",
                  (json_int_t)o->min_length, "bos", o->add_bos, "eos", o->add_eos);
    json_t *root = pol ? json_pack("{s:s, s:i, s:s, s:I, s:s, s:i, s:i, s:i, s:i, s:i, s:i, "
                                   "s:i, s:o}",
                                   "format", "moe-tokenizer", "version", 1, "name", t->name,
                                   "vocab_size", (json_int_t)t->vocab_size, "vocab_hash", hash, "k",
                                   moe_tokenizer_max_bases_per_token(t), "pad_id", t->pad_id,
                                   "bos_id", t->bos_id, "eos_id", t->eos_id, "unk_id", t->unk_id,
                                   "mask_id", t->mask_id, "sep_id", t->sep_id, "policies", pol)
                       : NULL;
    if (!root) {
        json_decref(pol);
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "cannot build the tokenizer spec JSON");
    }
    t->spec_json = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(root);
    if (!t->spec_json) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory (spec)");
    return MOE_OK;
}

void moe_tokenizer_free(moe_tokenizer *t) {
    if (!t) return;
    if (t->vocab)
        for (int64_t i = 0; i < t->vocab_size; i++)
            free(t->vocab[i]);
    free(t->vocab);
    free(t->spec_json);
    free(t);
}

moe_status moe_tokenizer_create(moe_tokenizer **out, const moe_tokenizer_opts *o, moe_err *err) {
    *out = NULL;
    if (validate_opts(o, err) != MOE_OK) return MOE_ERR_INPUT;
    moe_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory (tokenizer)");
    t->opts = *o;
    t->kind = o->kind;
    t->impl = kind_find(o->kind);
    t->name = t->impl->name;
    t->pad_id = t->eos_id = t->bos_id = t->unk_id = t->mask_id = t->sep_id = -1;
    moe_status st = t->impl->build(t, err);
    if (st == MOE_OK) {
        t->vocab_hash = vocab_hash(t);
        st = build_spec(t, err);
    }
    if (st != MOE_OK) {
        moe_tokenizer_free(t);
        return st;
    }
    *out = t;
    return MOE_OK;
}

/* ---- spec JSON -> tokenizer ---- */

static moe_status spec_bad(moe_err *err, const char *src, const char *what) {
    moe_err_set(err, MOE_ERR_INPUT, src, "tokenizer spec: %s", what);
    moe_err_hint(err, "the spec is written by moe-tokenize; regenerate the file if edited");
    return MOE_ERR_INPUT;
}

static int get_policy(json_t *pol, const char *key, int (*parse)(const char *), int dflt) {
    json_t *v = json_object_get(pol, key);
    if (!v) return dflt;
    return json_is_string(v) ? parse(json_string_value(v)) : -1;
}

static int64_t get_int(json_t *obj, const char *key, int64_t dflt, int *bad) {
    json_t *v = json_object_get(obj, key);
    if (!v) return dflt;
    if (!json_is_integer(v)) {
        *bad = 1;
        return dflt;
    }
    return (int64_t)json_integer_value(v);
}

moe_status moe_tokenizer_from_json(moe_tokenizer **out, const char *json, const char *src,
                                   moe_err *err) {
    *out = NULL;
    json_error_t jerr;
    json_t *root = json_loads(json, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        moe_err_set(err, MOE_ERR_INPUT, src, "tokenizer spec is not valid JSON: %s (line %d)",
                    jerr.text, jerr.line);
        return MOE_ERR_INPUT;
    }
    moe_status st = MOE_OK;
    json_t *pol = json_object_get(root, "policies");
    json_t *fmt = json_object_get(root, "format");
    int kind = moe_tokenizer_kind_parse(json_string_value(json_object_get(root, "name")));
    if (!json_is_object(root) || !json_is_string(fmt) ||
        strcmp(json_string_value(fmt), "moe-tokenizer") != 0)
        st = spec_bad(err, src, "\"format\" is not \"moe-tokenizer\"");
    else if (kind < 0)
        st = spec_bad(err, src, "\"name\" must be byte, nuc or kmer");
    else if (pol && !json_is_object(pol))
        st = spec_bad(err, src, "\"policies\" must be an object");
    if (st != MOE_OK) {
        json_decref(root);
        return st;
    }
    moe_tokenizer_opts o;
    moe_tokenizer_opts_defaults(&o, (moe_tokenizer_kind)kind);
    int bad = 0;
    int c = get_policy(pol, "case", moe_case_policy_parse, (int)o.case_policy);
    int iu = get_policy(pol, "iupac", moe_iupac_policy_parse, (int)o.iupac);
    int nr = get_policy(pol, "n_runs", moe_nrun_policy_parse, (int)o.nrun);
    int rc = get_policy(pol, "revcomp", moe_revcomp_policy_parse, (int)o.revcomp);
    if (c < 0 || iu < 0 || nr < 0 || rc < 0) bad = 1;
    o.case_policy = (moe_case_policy)(c < 0 ? 0 : c);
    o.iupac = (moe_iupac_policy)(iu < 0 ? 0 : iu);
    o.nrun = (moe_nrun_policy)(nr < 0 ? 0 : nr);
    o.revcomp = (moe_revcomp_policy)(rc < 0 ? 0 : rc);
    o.seed = (uint64_t)get_int(pol, "seed", 0, &bad);
    o.window = get_int(pol, "window", 0, &bad);
    o.stride = get_int(pol, "stride", 0, &bad);
    o.min_length = get_int(pol, "min_length", o.min_length, &bad);
    json_t *b = json_object_get(pol, "bos"), *e = json_object_get(pol, "eos");
    if ((b && !json_is_boolean(b)) || (e && !json_is_boolean(e))) bad = 1;
    if (b) o.add_bos = json_is_true(b);
    if (e) o.add_eos = json_is_true(e);
    int64_t vs = get_int(root, "vocab_size", -1, &bad);
    if (kind == MOE_TOKENIZER_BYTE) o.vocab_size = vs;
    if (kind == MOE_TOKENIZER_KMER) o.k = (int)get_int(root, "k", 6, &bad);
    const char *hash = json_string_value(json_object_get(root, "vocab_hash"));
    if (bad || vs < 0 || !hash) {
        json_decref(root);
        return spec_bad(
            err, src,
            "a policy, \"vocab_size\" or \"vocab_hash\" is missing or has the wrong type");
    }
    moe_tokenizer *t = NULL;
    st = moe_tokenizer_create(&t, &o, err);
    if (st != MOE_OK) {
        moe_err_prefix(err, "tokenizer spec%s%s", src ? " in " : "", src ? src : "");
        json_decref(root);
        return st;
    }
    char want[32];
    snprintf(want, sizeof want, "%016llx", (unsigned long long)t->vocab_hash);
    int32_t ids[6] = {t->pad_id, t->bos_id, t->eos_id, t->unk_id, t->mask_id, t->sep_id};
    const char *id_keys[6] = {"pad_id", "bos_id", "eos_id", "unk_id", "mask_id", "sep_id"};
    for (int i = 0; i < 6 && st == MOE_OK; i++)
        if (get_int(root, id_keys[i], ids[i], &bad) != ids[i] || bad)
            st = spec_bad(err, src, "special token ids differ from this build's vocabulary");
    if (st == MOE_OK && (vs != t->vocab_size || strcmp(hash, want) != 0)) {
        moe_err_set(err, MOE_ERR_INPUT, src,
                    "tokenizer spec: vocabulary (size %lld, hash %s) differs from the one this "
                    "build makes from the same options (size %lld, hash %s)",
                    (long long)vs, hash, (long long)t->vocab_size, want);
        moe_err_hint(err, "the file was made by an incompatible moe-tokenize version");
        st = MOE_ERR_INPUT;
    }
    json_decref(root);
    if (st != MOE_OK) {
        moe_tokenizer_free(t);
        return st;
    }
    *out = t;
    return MOE_OK;
}

const char *moe_tokenizer_spec_json(const moe_tokenizer *t) {
    return t->spec_json;
}

const char *moe_tokenizer_token_str(const moe_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->vocab_size) return "?";
    return t->vocab[id];
}

int moe_tokenizer_is_special(const moe_tokenizer *t, int32_t id) {
    return id == t->pad_id || id == t->bos_id || id == t->eos_id || id == t->unk_id ||
           id == t->mask_id || id == t->sep_id;
}

int moe_tokenizer_max_bases_per_token(const moe_tokenizer *t) {
    return t->kind == MOE_TOKENIZER_KMER ? t->opts.k : 1;
}

int moe_tokenizer_is_n(const moe_tokenizer *t, int32_t id) {
    if (t->kind == MOE_TOKENIZER_KMER) return id == t->n_id;
    if (id < 0 || id >= (int32_t)sizeof t->dec) return 0;
    return t->dec[id] == 'N' || t->dec[id] == 'n';
}

/* ---- token buffers, encode, decode ---- */

moe_status moe_token_buf_reserve(moe_token_buf *b, int64_t cap, moe_err *err) {
    /* pos is either NULL or as large as ids: it is only allocated once want_pos is set */
    int need_pos = b->want_pos && !b->pos;
    if (cap <= b->cap && !need_pos) return MOE_OK;
    int64_t nc = b->cap ? b->cap : 1024;
    while (nc < cap)
        nc *= 2;
    if (nc > b->cap) {
        int32_t *ids = realloc(b->ids, (size_t)nc * sizeof *ids);
        if (ids) b->ids = ids;
        uint8_t *lo = ids ? realloc(b->lower, (size_t)nc) : NULL;
        if (!lo) goto oom;
        b->lower = lo;
    }
    if (b->pos || b->want_pos) {
        int64_t *pos = realloc(b->pos, (size_t)nc * sizeof *pos);
        if (!pos) goto oom;
        b->pos = pos;
    }
    b->cap = nc;
    return MOE_OK;
oom:
    return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory (%lld tokens)", (long long)nc);
}

void moe_token_buf_free(moe_token_buf *b) {
    free(b->ids);
    free(b->lower);
    free(b->pos);
    memset(b, 0, sizeof *b);
}

static moe_status bad_char(moe_err *err, unsigned char c, int64_t pos) {
    if (c > 32 && c < 127)
        moe_err_set(err, MOE_ERR_INPUT, NULL,
                    "character '%c' (0x%02x) at base %lld is not a nucleotide code", c, c,
                    (long long)pos + 1);
    else
        moe_err_set(err, MOE_ERR_INPUT, NULL, "byte 0x%02x at base %lld is not a nucleotide code",
                    c, (long long)pos + 1);
    moe_err_hint(err, "IUPAC codes (RYSWKMBDHVU) follow --iupac keep|to-n|drop; gaps, '*', "
                      "digits and other characters must be removed from the input");
    return MOE_ERR_INPUT;
}

moe_status moe_tokenizer_encode(const moe_tokenizer *t, const char *seq, int64_t len,
                                moe_token_buf *out, moe_err *err) {
    return t->impl->encode(t, seq, len, out, err);
}

/* moe_tokenizer_encode for the kinds with one token per base (byte, nuc): enc[] maps each
 * byte to its id. */
static moe_status encode_per_base(const moe_tokenizer *t, const char *seq, int64_t len,
                                  moe_token_buf *out, moe_err *err) {
    if (moe_token_buf_reserve(out, out->n + len, err) != MOE_OK) return MOE_ERR_RUNTIME;
    /* locals so that the stores through ids/lower cannot make the compiler reload them */
    const unsigned char *restrict s = (const unsigned char *)seq;
    const int16_t *restrict enc = t->enc;
    const uint8_t *restrict enc_lower = t->enc_lower, *restrict enc_is_n = t->enc_is_n;
    int32_t *restrict ids = out->ids + out->n;
    uint8_t *restrict lower = out->lower + out->n;
    int64_t *restrict pos = out->want_pos ? out->pos + out->n : NULL;
    const int collapse = t->opts.nrun == MOE_NRUN_COLLAPSE;
    int64_t n = 0;
    int prev_n = 0;
    if (!collapse && !pos) { /* the common case: one token per base, no bookkeeping */
        int16_t bad = 0;
        for (int64_t i = 0; i < len; i++) {
            int16_t id = enc[s[i]];
            bad |= id;
            ids[i] = id;
            lower[i] = enc_lower[s[i]];
        }
        if (bad >= 0) {
            out->n += len;
            return MOE_OK;
        }
    }
    for (int64_t i = 0; i < len; i++) {
        unsigned char c = s[i];
        int16_t id = enc[c];
        if (id < 0) {
            if (id == MOE_TOK_DROP) continue;
            out->n += n;
            return bad_char(err, c, i);
        }
        if (collapse) {
            int is_n = enc_is_n[c];
            if (is_n && prev_n) continue;
            prev_n = is_n;
        }
        ids[n] = id;
        lower[n] = enc_lower[c];
        if (pos) pos[n] = i;
        n++;
    }
    out->n += n;
    return MOE_OK;
}

static moe_status push_special(moe_token_buf *out, int32_t id, moe_err *err) {
    if (moe_token_buf_reserve(out, out->n + 1, err) != MOE_OK) return MOE_ERR_RUNTIME;
    out->ids[out->n] = id;
    out->lower[out->n] = 0;
    if (out->want_pos) out->pos[out->n] = -1;
    out->n++;
    return MOE_OK;
}

moe_status moe_tokenizer_encode_doc(const moe_tokenizer *t, const char *seq, int64_t len,
                                    moe_token_buf *out, moe_err *err) {
    if (t->opts.add_bos && push_special(out, t->bos_id, err) != MOE_OK) return MOE_ERR_RUNTIME;
    moe_status st = moe_tokenizer_encode(t, seq, len, out, err);
    if (st != MOE_OK) return st;
    if (t->opts.add_eos && push_special(out, t->eos_id, err) != MOE_OK) return MOE_ERR_RUNTIME;
    return MOE_OK;
}

int64_t moe_tokenizer_decode(const moe_tokenizer *t, const int32_t *ids, const uint8_t *lower,
                             int64_t n, char *out) {
    return t->impl->decode(t, ids, lower, n, out);
}

/* moe_tokenizer_decode for the kinds with one token per base: dec[] maps each id to its
 * base. */
static int64_t decode_per_base(const moe_tokenizer *t, const int32_t *ids, const uint8_t *lower,
                               int64_t n, char *out) {
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= (int32_t)sizeof t->dec || !t->dec[id]) continue;
        char b = t->dec[id];
        out[m++] = lower && lower[i] ? (char)tolower((unsigned char)b) : b;
    }
    return m;
}
