/* config: reading a run configuration from YAML and "a.b=value" overrides, and validating it.
 *
 * The YAML is parsed with libyaml's document loader, then walked as two levels of mappings
 * (section -> key -> scalar) against the schema table (config_schema.c); there is no code
 * per key. The one thing to know: every error names where it came from. A bad key or value
 * points at its file:line:col, an override names the override text, and a failed
 * cross-field rule points at the line of the key that the file set, when it set one. */
#include "moe/config.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "io/config_schema.h"
#include "moe/fileio.h"

/* Where a key's value came from, so a validation error can point at the right line. */
typedef struct cfg_origin {
    int from_file; /* 1 when the file set it (line/col valid), 2 when an override did */
    int64_t line, col;
    int override_index; /* 0-based, when from_file == 2 */
} cfg_origin;

typedef struct cfg_loader {
    moe_config *c;
    const char *name;   /* file name used in error messages */
    cfg_origin *origin; /* [moe_cfg_n_keys] */
    yaml_document_t *doc;
} cfg_loader;

/* ---- suggestions for unknown keys ------------------------------------------------------ */

/* Optimal-string-alignment distance (Levenshtein plus adjacent transpositions), case-folded,
 * when it is below limit; otherwise some value >= limit (the lengths alone can tell: the
 * distance is at least their difference, so the callers' search for the closest key skips
 * most of them without the table). */
static int edit_distance(const char *a, const char *b, int limit) {
    enum { MAXL = 64 };
    size_t na = strlen(a), nb = strlen(b);
    if (na >= MAXL || nb >= MAXL) return 1000;
    if ((na > nb ? na - nb : nb - na) >= (size_t)limit) return limit;
    int d[MAXL][MAXL], above_min = 0; /* the smallest value of the row before */
    for (size_t i = 0; i <= na; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= nb; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        int row_min = d[i][0];
        for (size_t j = 1; j <= nb; j++) {
            int ca = a[i - 1] | 0x20, cb = b[j - 1] | 0x20; /* ASCII letters: fold case */
            int best = d[i - 1][j - 1] + (ca != cb);
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
            if (best < row_min) row_min = best;
        }
        /* two rows at limit or more: so is every later value (each is one of the two rows
         * above plus 0 or 1, or its left neighbour plus 1, and a later row starts above i,
         * which is >= row_min) */
        if (row_min >= limit && above_min >= limit) return limit;
        above_min = row_min;
    }
    return d[na][nb];
}

/* The smallest distance from `typed` that is no longer a typo but a different word. */
static int typo_limit(const char *typed) {
    int n = (int)strlen(typed);
    return (n < 6 ? 2 : n / 3 + 1) + 1;
}

/* 1 when every '_'-separated word of `typed` occurs as a word of `key`, as `num_layers`
 * does in `num_hidden_layers`. */
static int words_within(const char *typed, const char *key) {
    int words = 0;
    for (const char *w = typed; *w;) {
        size_t n = strcspn(w, "_");
        int found = 0;
        for (const char *v = key; *v && n;) {
            size_t m = strcspn(v, "_");
            if (m == n && strncmp(v, w, n) == 0) found = 1;
            v += m + (v[m] == '_');
        }
        if (n && !found) return 0;
        words += n > 0;
        w += n + (w[n] == '_');
    }
    return words >= 2;
}

/* Hint for an unknown key `leaf` in `section` ("" = top level): the closest key of the
 * section, the same key name in another section, or the closest section name. */
static void suggest(const char *section, const char *leaf, char *hint, size_t n) {
    const char *best = NULL;
    int best_d = typo_limit(leaf); /* farther keys are no suggestion: not searched */
    for (int i = 0; i < moe_cfg_n_keys; i++) {
        const moe_cfg_key *k = &moe_cfg_keys[i];
        if (!moe_cfg_in_section(k, section)) continue;
        int d = edit_distance(leaf, moe_cfg_leaf(k), best_d);
        if (d < best_d) best_d = d, best = k->key;
    }
    if (!section[0]) { /* at the top level a section name is also a valid key */
        for (int s = 1; s < moe_cfg_n_sections; s++) {
            int d = edit_distance(leaf, moe_cfg_sections[s].name, best_d);
            if (d < best_d) best_d = d, best = moe_cfg_sections[s].name;
        }
    }
    /* A one-letter slip beats the same name in another section (`optim.eps` for `epss`),
     * which beats a looser match (`optim.eps` for `optim.steps` would mislead). */
    if (best && best_d <= 1) {
        snprintf(hint, n, "did you mean `%s`? (docs/config.md lists every key)", best);
        return;
    }
    for (int i = 0; i < moe_cfg_n_keys; i++) { /* right key, wrong section? */
        const moe_cfg_key *k = &moe_cfg_keys[i];
        const char *dot = strchr(k->key, '.');
        if (strcmp(moe_cfg_leaf(k), leaf) == 0 && !moe_cfg_in_section(k, section)) {
            snprintf(hint, n, "did you mean `%s`? `%s` belongs %s%.*s", k->key, leaf,
                     dot ? "in section " : "at the top level", dot ? (int)(dot - k->key) : 0,
                     k->key);
            return;
        }
    }
    if (best) { /* a plausible typo */
        snprintf(hint, n, "did you mean `%s`? (docs/config.md lists every key)", best);
        return;
    }
    for (int i = 0; i < moe_cfg_n_keys; i++) { /* words of the typo all in one key? */
        const moe_cfg_key *k = &moe_cfg_keys[i];
        if (moe_cfg_in_section(k, section) && words_within(leaf, moe_cfg_leaf(k))) {
            snprintf(hint, n, "did you mean `%s`? (docs/config.md lists every key)", k->key);
            return;
        }
    }
    if (section[0])
        snprintf(hint, n, "section `%s` has no such key; docs/config.md lists every key", section);
    else
        snprintf(hint, n,
                 "valid top-level keys: device, model, data, train, optim, precision, "
                 "parallel, checkpoint, log");
}

/* ---- YAML walking ---------------------------------------------------------------------- */

static const char *node_kind(const yaml_node_t *nd) {
    switch (nd->type) {
    case YAML_SCALAR_NODE:
        return "a scalar";
    case YAML_SEQUENCE_NODE:
        return "a sequence";
    case YAML_MAPPING_NODE:
        return "a mapping";
    default:
        return "nothing";
    }
}

static int is_null_scalar(const yaml_node_t *nd) {
    if (nd->type != YAML_SCALAR_NODE || nd->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return 0;
    const char *v = (const char *)nd->data.scalar.value;
    return strcmp(v, "") == 0 || strcmp(v, "~") == 0 || strcmp(v, "null") == 0 ||
           strcmp(v, "Null") == 0 || strcmp(v, "NULL") == 0;
}

static moe_status err_at(cfg_loader *L, moe_err *err, yaml_mark_t mark, const char *hint,
                         const char *fmt, const char *a, const char *b) {
    moe_err_set(err, MOE_ERR_INPUT, L->name, fmt, a, b);
    moe_err_at_line(err, (int64_t)mark.line + 1, (int64_t)mark.column + 1);
    if (hint && hint[0]) moe_err_hint(err, "%s", hint);
    return MOE_ERR_INPUT;
}

/* Key node of a mapping pair as text, or an error when the key is not a scalar. */
static const char *pair_key(cfg_loader *L, const yaml_node_pair_t *p, yaml_node_t **knode,
                            moe_err *err) {
    *knode = yaml_document_get_node(L->doc, p->key);
    if (!*knode || (*knode)->type != YAML_SCALAR_NODE) {
        if (*knode)
            err_at(L, err, (*knode)->start_mark, "keys are plain names such as `steps`",
                   "expected a key name, got %s%s", node_kind(*knode), "");
        else
            moe_err_set(err, MOE_ERR_INPUT, L->name, "malformed mapping");
        return NULL;
    }
    return (const char *)(*knode)->data.scalar.value;
}

/* Error when an earlier pair of the same mapping has the same key text. */
static moe_status check_duplicate(cfg_loader *L, yaml_node_t *map, yaml_node_pair_t *p,
                                  const char *shown, moe_err *err) {
    yaml_node_t *kn = yaml_document_get_node(L->doc, p->key);
    for (yaml_node_pair_t *q = map->data.mapping.pairs.start; q < p; q++) {
        yaml_node_t *qk = yaml_document_get_node(L->doc, q->key);
        if (!qk || qk->type != YAML_SCALAR_NODE) continue;
        if (strcmp((const char *)qk->data.scalar.value, (const char *)kn->data.scalar.value))
            continue;
        char hint[128];
        snprintf(hint, sizeof hint, "it was first set at line %lu; keep one of them",
                 (unsigned long)qk->start_mark.line + 1);
        return err_at(L, err, kn->start_mark, hint, "duplicate key `%s`%s", shown, "");
    }
    return MOE_OK;
}

/* Applies one `key: value` pair to the key row k. */
static moe_status apply_value(cfg_loader *L, const moe_cfg_key *k, yaml_node_t *kn, yaml_node_t *vn,
                              moe_err *err) {
    char why[512], hint[256];
    snprintf(hint, sizeof hint, "e.g. `%s: %s` (the default); see docs/config.md", moe_cfg_leaf(k),
             k->def);
    if (!vn || vn->type != YAML_SCALAR_NODE)
        return err_at(L, err, vn ? vn->start_mark : kn->start_mark, hint,
                      "`%s`: expected a single value, got %s", k->key,
                      vn ? node_kind(vn) : "nothing");
    const char *text = (const char *)vn->data.scalar.value;
    size_t len = vn->data.scalar.length;
    if (k->type == MOE_CFG_STRING && is_null_scalar(vn)) len = 0; /* `path:` or `path: ~` */
    if (moe_cfg_parse_value(k, L->c, text, len, why, sizeof why) ||
        moe_cfg_check_range(k, L->c, why, sizeof why))
        return err_at(L, err, vn->start_mark, hint, "`%s`: %s", k->key, why);
    cfg_origin *o = &L->origin[k - moe_cfg_keys];
    o->from_file = 1;
    o->line = (int64_t)kn->start_mark.line + 1;
    o->col = (int64_t)kn->start_mark.column + 1;
    return MOE_OK;
}

static moe_status walk_section(cfg_loader *L, const char *section, yaml_node_t *kn,
                               yaml_node_t *map, moe_err *err) {
    if (is_null_scalar(map)) return MOE_OK; /* `train:` with nothing under it */
    if (map->type != YAML_MAPPING_NODE) {
        char hint[160];
        snprintf(hint, sizeof hint,
                 "write `%s:` on its own line followed by indented `key: value` lines", section);
        return err_at(L, err, map->start_mark, hint, "section `%s` must be a mapping, got %s",
                      section, node_kind(map));
    }
    (void)kn;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *pk;
        const char *leaf = pair_key(L, p, &pk, err);
        if (!leaf) return MOE_ERR_INPUT;
        char dotted[256];
        snprintf(dotted, sizeof dotted, "%s.%s", section, leaf);
        if (check_duplicate(L, map, p, dotted, err)) return MOE_ERR_INPUT;
        const moe_cfg_key *k = moe_cfg_find(dotted);
        if (!k) {
            char hint[256];
            suggest(section, leaf, hint, sizeof hint);
            return err_at(L, err, pk->start_mark, hint, "unknown key `%s`%s", dotted, "");
        }
        if (apply_value(L, k, pk, yaml_document_get_node(L->doc, p->value), err))
            return MOE_ERR_INPUT;
    }
    return MOE_OK;
}

static moe_status walk_root(cfg_loader *L, moe_err *err) {
    yaml_node_t *root = yaml_document_get_root_node(L->doc);
    if (!root || is_null_scalar(root)) return MOE_OK; /* empty file: all defaults */
    if (root->type != YAML_MAPPING_NODE)
        return err_at(L, err, root->start_mark,
                      "a config is a mapping of sections, e.g. `train:` then `  steps: 100`",
                      "expected a mapping at the top level, got %s%s", node_kind(root), "");
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top;
         p++) {
        yaml_node_t *pk;
        const char *name = pair_key(L, p, &pk, err);
        if (!name) return MOE_ERR_INPUT;
        if (check_duplicate(L, root, p, name, err)) return MOE_ERR_INPUT;
        yaml_node_t *vn = yaml_document_get_node(L->doc, p->value);
        int is_section = 0;
        for (int s = 1; s < moe_cfg_n_sections; s++)
            if (strcmp(name, moe_cfg_sections[s].name) == 0) is_section = 1;
        if (is_section) {
            if (walk_section(L, name, pk, vn, err)) return MOE_ERR_INPUT;
            continue;
        }
        const moe_cfg_key *k = strchr(name, '.') ? NULL : moe_cfg_find(name);
        if (!k) {
            char hint[256];
            const moe_cfg_key *dotted = moe_cfg_find(name);
            if (dotted) /* `train.steps: 5`: dotted paths are for the command line */
                snprintf(hint, sizeof hint,
                         "in YAML write it nested: `%.*s:` then an indented "
                         "`%s: ...` line",
                         (int)(strchr(name, '.') - name), name, moe_cfg_leaf(dotted));
            else
                suggest("", name, hint, sizeof hint);
            return err_at(L, err, pk->start_mark, hint, "unknown key `%s`%s", name, "");
        }
        if (apply_value(L, k, pk, vn, err)) return MOE_ERR_INPUT;
    }
    return MOE_OK;
}

/* Parses YAML text (len bytes) into L->c. */
static moe_status load_text(cfg_loader *L, const char *text, size_t len, moe_err *err) {
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser))
        return moe_err_set(err, MOE_ERR_RUNTIME, L->name, "cannot initialise the YAML parser");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    moe_status st = MOE_OK;
    if (!yaml_parser_load(&parser, &doc)) {
        yaml_mark_t m = parser.problem_mark;
        if (parser.context)
            moe_err_set(err, MOE_ERR_INPUT, L->name,
                        "malformed YAML: %s (%s that starts at line %lu)",
                        parser.problem ? parser.problem : "syntax error", parser.context,
                        (unsigned long)parser.context_mark.line + 1);
        else
            moe_err_set(err, MOE_ERR_INPUT, L->name, "malformed YAML: %s",
                        parser.problem ? parser.problem : "syntax error");
        moe_err_at_line(err, (int64_t)m.line + 1, (int64_t)m.column + 1);
        moe_err_hint(err, "check indentation (spaces, not tabs) and `key: value` syntax here");
        yaml_parser_delete(&parser);
        return MOE_ERR_INPUT;
    }
    L->doc = &doc;
    st = walk_root(L, err);
    L->doc = NULL;
    yaml_document_delete(&doc);
    if (st == MOE_OK) { /* a second document would be silently ignored: refuse it */
        yaml_document_t more;
        if (!yaml_parser_load(&parser, &more)) {
            moe_err_set(err, MOE_ERR_INPUT, L->name, "malformed YAML: %s",
                        parser.problem ? parser.problem : "syntax error");
            moe_err_at_line(err, (int64_t)parser.problem_mark.line + 1,
                            (int64_t)parser.problem_mark.column + 1);
            st = MOE_ERR_INPUT;
        } else {
            yaml_node_t *r = yaml_document_get_root_node(&more);
            if (r) {
                st = err_at(L, err, r->start_mark, "put the whole config in one document",
                            "more than one YAML document (`---`)%s%s", "", "");
            }
            yaml_document_delete(&more);
        }
    }
    yaml_parser_delete(&parser);
    return st;
}

/* ---- setting single keys --------------------------------------------------------------- */

static moe_status set_key(moe_config *c, const char *dotted, const char *value, moe_err *err) {
    char why[512];
    const moe_cfg_key *k = moe_cfg_find(dotted);
    if (!k) {
        char section[64] = "", hint[256];
        const char *dot = strchr(dotted, '.');
        const char *leaf = dot ? dot + 1 : dotted;
        if (dot && (size_t)(dot - dotted) < sizeof section)
            snprintf(section, sizeof section, "%.*s", (int)(dot - dotted), dotted);
        int known_section = !dot;
        for (int s = 1; s < moe_cfg_n_sections; s++) {
            if (strcmp(section, moe_cfg_sections[s].name) == 0) known_section = 1;
            if (!dot && strcmp(dotted, moe_cfg_sections[s].name) == 0) {
                moe_err_set(err, MOE_ERR_INPUT, NULL, "`%s` is a section, not a key", dotted);
                moe_err_hint(err, "set one key inside it, e.g. %s", moe_cfg_sections[s].name);
                for (int i = 0; i < moe_cfg_n_keys; i++)
                    if (moe_cfg_in_section(&moe_cfg_keys[i], dotted)) {
                        moe_err_hint(err, "set one key inside it, e.g. %s=%s", moe_cfg_keys[i].key,
                                     moe_cfg_keys[i].def);
                        break;
                    }
                return MOE_ERR_INPUT;
            }
        }
        if (known_section) {
            suggest(section, leaf, hint, sizeof hint);
        } else { /* unknown section: compare the whole dotted path with every key */
            int best_d = typo_limit(dotted); /* farther keys are no suggestion */
            const char *best = NULL;
            for (int i = 0; i < moe_cfg_n_keys; i++) {
                int d = edit_distance(dotted, moe_cfg_keys[i].key, best_d);
                if (d < best_d) best_d = d, best = moe_cfg_keys[i].key;
            }
            if (best)
                snprintf(hint, sizeof hint, "did you mean `%s`? (docs/config.md lists every key)",
                         best);
            else
                suggest("", section, hint, sizeof hint);
        }
        moe_err_set(err, MOE_ERR_INPUT, NULL, "unknown key `%s`", dotted);
        moe_err_hint(err, "%s", hint);
        return MOE_ERR_INPUT;
    }
    size_t len = strlen(value);
    if (len >= 2 && (value[0] == '"' || value[0] == '\'') && value[len - 1] == value[0]) {
        value++; /* key="a b" survives a shell that kept the quotes */
        len -= 2;
    }
    if (moe_cfg_parse_value(k, c, value, len, why, sizeof why) ||
        moe_cfg_check_range(k, c, why, sizeof why)) {
        moe_err_set(err, MOE_ERR_INPUT, NULL, "`%s`: %s", k->key, why);
        moe_err_hint(err, "e.g. %s=%s (the default); see docs/config.md", k->key, k->def);
        return MOE_ERR_INPUT;
    }
    return MOE_OK;
}

moe_status moe_config_set(moe_config *c, const char *dotted_key, const char *value, moe_err *err) {
    return set_key(c, dotted_key, value, err);
}

/* ---- validation ------------------------------------------------------------------------ */

/* Fails with a message naming key a (and b); *bad gets the keys so the caller can point at
 * the file line that set them. */
static moe_status rule_fail(moe_err *err, const char **bad, const char *a, const char *b,
                            const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static moe_status rule_fail(moe_err *err, const char **bad, const char *a, const char *b,
                            const char *hint, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    moe_err_set(err, MOE_ERR_INPUT, NULL, "%s", msg);
    if (hint) moe_err_hint(err, "%s", hint);
    bad[0] = a;
    bad[1] = b;
    return MOE_ERR_INPUT;
}

moe_recipe moe_config_recipe(const moe_config *c) {
    moe_recipe r = c->precision.recipe;
    if (r == MOE_RECIPE_FP8_BLOCK) {
        const int pow2 = c->precision.fp8_scale == MOE_FP8_SCALE_POW2,
                  xt = c->precision.fp8_wgrad == MOE_FP8_WGRAD_X_TILES;
        return xt ? (pow2 ? MOE_RECIPE_FP8_BLOCK_POW2_XT : MOE_RECIPE_FP8_BLOCK_XT)
                  : (pow2 ? MOE_RECIPE_FP8_BLOCK_POW2 : r);
    }
    if (r == MOE_RECIPE_MXFP8 && c->precision.fp8_scale == MOE_FP8_SCALE_OCP_FLOOR)
        return MOE_RECIPE_MXFP8_FLOOR;
    return r;
}

moe_status moe_config_skip_layers(const moe_config *c, uint8_t *skip, moe_err *err) {
    int64_t L = c->model.num_hidden_layers;
    if (skip) memset(skip, 0, (size_t)L);
    const char *p = c->precision.skip_layers;
    while (*p) {
        char *end;
        long long v = strtoll(p, &end, 10);
        size_t n = strcspn(p, ",");
        if (end == p || (size_t)(end - p) != n || v < -L || v >= L) {
            moe_err_set(err, MOE_ERR_INPUT, NULL,
                        "`precision.skip_layers`: '%.*s' is not a layer index in [%lld, %lld)",
                        (int)n, p, (long long)-L, (long long)L);
            moe_err_hint(err, "comma-separated layer indices, negative from the end: \"0,-1\" "
                              "keeps the first and the last layer in bf16");
            return MOE_ERR_INPUT;
        }
        if (skip) skip[v < 0 ? v + L : v] = 1;
        p += n + (p[n] == ',');
    }
    return MOE_OK;
}

static moe_status validate(const moe_config *c, moe_err *err, const char **bad) {
    char why[512], hint[256];
    bad[0] = bad[1] = NULL;
    for (int i = 0; i < moe_cfg_n_keys; i++) {
        const moe_cfg_key *k = &moe_cfg_keys[i];
        if (moe_cfg_check_range(k, c, why, sizeof why)) {
            bad[0] = k->key;
            moe_err_set(err, MOE_ERR_INPUT, NULL, "`%s`: %s", k->key, why);
            moe_err_hint(err, "the default is %s; see docs/config.md", k->def);
            return MOE_ERR_INPUT;
        }
    }
    const moe_model_config *m = &c->model;
    const moe_train_config *t = &c->train;
    if (moe_config_skip_layers(c, NULL, err) != MOE_OK) {
        bad[0] = "precision.skip_layers";
        return MOE_ERR_INPUT;
    }
    const moe_precision_config *pc = &c->precision;
    if ((pc->fp8_scale == MOE_FP8_SCALE_POW2 && pc->recipe != MOE_RECIPE_FP8_BLOCK) ||
        (pc->fp8_scale == MOE_FP8_SCALE_OCP_FLOOR && pc->recipe != MOE_RECIPE_MXFP8))
        return rule_fail(err, bad, "precision.fp8_scale", "precision.recipe",
                         "pow2 is a rule of fp8-block, ocp-floor one of mxfp8",
                         "precision.fp8_scale %s does not apply to precision.recipe %s",
                         pc->fp8_scale == MOE_FP8_SCALE_POW2 ? "pow2" : "ocp-floor",
                         moe_recipe_name(pc->recipe));
    if (pc->fp8_wgrad == MOE_FP8_WGRAD_X_TILES && pc->recipe != MOE_RECIPE_FP8_BLOCK)
        return rule_fail(err, bad, "precision.fp8_wgrad", "precision.recipe",
                         "use precision.fp8_wgrad: blocks (the default) with this recipe",
                         "precision.fp8_wgrad x-tiles is an option of precision.recipe "
                         "fp8-block, got %s",
                         moe_recipe_name(pc->recipe));
    if (c->optim.master == MOE_MASTER_SPLIT && pc->recipe != MOE_RECIPE_BF16)
        return rule_fail(err, bad, "optim.master", "precision.recipe",
                         "use optim.master: fp32 (the default) with this recipe, or "
                         "precision.recipe: bf16",
                         "optim.master split needs precision.recipe bf16, got %s: a split master "
                         "is a weight's bf16 copy plus 16 low bits, and only the bf16 recipe "
                         "keeps bf16 copies of the weights",
                         moe_recipe_name(pc->recipe));
    if (m->hidden_size % m->num_attention_heads)
        return rule_fail(err, bad, "model.hidden_size", "model.num_attention_heads",
                         "choose num_attention_heads among the divisors of hidden_size",
                         "model.hidden_size (%lld) is not divisible by "
                         "model.num_attention_heads (%lld)",
                         (long long)m->hidden_size, (long long)m->num_attention_heads);
    int64_t head_dim = m->hidden_size / m->num_attention_heads;
    if (head_dim % 2) {
        snprintf(hint, sizeof hint,
                 "RoPE rotates pairs of dimensions; e.g. hidden_size %lld keeps these heads",
                 (long long)((head_dim + 1) * m->num_attention_heads));
        return rule_fail(err, bad, "model.hidden_size", "model.num_attention_heads", hint,
                         "head_dim = model.hidden_size / model.num_attention_heads = %lld / "
                         "%lld is odd; it must be even",
                         (long long)m->hidden_size, (long long)m->num_attention_heads);
    }
    if (m->num_attention_heads % m->num_key_value_heads)
        return rule_fail(err, bad, "model.num_key_value_heads", "model.num_attention_heads",
                         "grouped-query attention shares each KV head among an equal number of "
                         "query heads; pick a divisor of num_attention_heads",
                         "model.num_attention_heads (%lld) is not divisible by "
                         "model.num_key_value_heads (%lld)",
                         (long long)m->num_attention_heads, (long long)m->num_key_value_heads);
    if (m->num_experts_per_tok > m->num_local_experts)
        return rule_fail(err, bad, "model.num_experts_per_tok", "model.num_local_experts",
                         "top-k routing picks k of the E experts: 1 <= k <= E",
                         "model.num_experts_per_tok (%lld) is larger than "
                         "model.num_local_experts (%lld)",
                         (long long)m->num_experts_per_tok, (long long)m->num_local_experts);
    if (t->seq_len > m->max_position_embeddings)
        return rule_fail(err, bad, "train.seq_len", "model.max_position_embeddings",
                         "shorten train.seq_len or raise model.max_position_embeddings",
                         "train.seq_len (%lld) exceeds model.max_position_embeddings "
                         "(%lld)",
                         (long long)t->seq_len, (long long)m->max_position_embeddings);
    if (m->num_local_experts % c->parallel.ep)
        return rule_fail(err, bad, "parallel.ep", "model.num_local_experts",
                         "experts are split evenly over the ranks of an expert group",
                         "parallel.ep (%lld) does not divide model.num_local_experts "
                         "(%lld)",
                         (long long)c->parallel.ep, (long long)m->num_local_experts);
    /* Every rank (dp x ep of them) trains on its own whole samples. */
    int64_t world = c->parallel.dp * c->parallel.ep;
    if (t->global_batch_tokens % (t->seq_len * world)) {
        snprintf(
            hint, sizeof hint, "e.g. train.global_batch_tokens=%lld",
            (long long)((t->global_batch_tokens / (t->seq_len * world) + 1) * t->seq_len * world));
        return rule_fail(err, bad, "train.global_batch_tokens", "train.seq_len", hint,
                         "train.global_batch_tokens (%lld) is not a multiple of train.seq_len "
                         "(%lld) x parallel.dp (%lld) x parallel.ep (%lld)",
                         (long long)t->global_batch_tokens, (long long)t->seq_len,
                         (long long)c->parallel.dp, (long long)c->parallel.ep);
    }
    if (t->micro_batch_tokens) {
        if (t->micro_batch_tokens % t->seq_len)
            return rule_fail(err, bad, "train.micro_batch_tokens", "train.seq_len",
                             "a micro-batch is whole samples; 0 means one per rank",
                             "train.micro_batch_tokens (%lld) is not a multiple of "
                             "train.seq_len (%lld)",
                             (long long)t->micro_batch_tokens, (long long)t->seq_len);
        if (t->global_batch_tokens % t->micro_batch_tokens)
            return rule_fail(err, bad, "train.micro_batch_tokens", "train.global_batch_tokens",
                             "the global batch is an integer number of micro-batches",
                             "train.micro_batch_tokens (%lld) does not divide "
                             "train.global_batch_tokens (%lld)",
                             (long long)t->micro_batch_tokens, (long long)t->global_batch_tokens);
        if ((t->global_batch_tokens / t->micro_batch_tokens) % world) {
            snprintf(hint, sizeof hint, "e.g. train.micro_batch_tokens=%lld",
                     (long long)(t->global_batch_tokens / world));
            return rule_fail(err, bad, "train.micro_batch_tokens", "parallel.dp", hint,
                             "the %lld micro-batches of a step (train.global_batch_tokens / "
                             "train.micro_batch_tokens) are not a multiple of the %lld ranks "
                             "(parallel.dp x parallel.ep) that share them",
                             (long long)(t->global_batch_tokens / t->micro_batch_tokens),
                             (long long)world);
        }
    }
    if (t->eval_tokens % t->seq_len)
        return rule_fail(err, bad, "train.eval_tokens", "train.seq_len",
                         "evaluation runs whole samples; 0 evaluates the whole validation set",
                         "train.eval_tokens (%lld) is not a multiple of train.seq_len (%lld)"
                         "",
                         (long long)t->eval_tokens, (long long)t->seq_len);
    if (c->optim.min_lr > c->optim.lr) {
        moe_err_set(err, MOE_ERR_INPUT, NULL, "optim.min_lr (%g) is larger than optim.lr (%g)",
                    c->optim.min_lr, c->optim.lr);
        moe_err_hint(err, "min_lr is the floor the schedule decays to from the peak lr");
        bad[0] = "optim.min_lr";
        bad[1] = "optim.lr";
        return MOE_ERR_INPUT;
    }
    if (c->optim.warmup_steps > t->steps)
        return rule_fail(err, bad, "optim.warmup_steps", "train.steps",
                         "warmup is part of the run: lower it or raise train.steps",
                         "optim.warmup_steps (%lld) exceeds train.steps (%lld)",
                         (long long)c->optim.warmup_steps, (long long)t->steps);
    /* bf16 moments: 8 significant bits, so one step moves a stored moment only by more than
     * half an ulp (2^-9 to 2^-8 of its value); a decay 1 - beta below that leaves beta * m
     * rounded back to m. 0.99 (a decay of 0.01 > 2^-8) keeps a margin. The optim.moments row
     * and the cross-field rules of config_schema.c state the same limit. */
    const double bf16_max_beta = 0.99;
    const moe_optim_config *o = &c->optim;
    if (o->moments == MOE_DTYPE_BF16 && (o->beta1 > bf16_max_beta || o->beta2 > bf16_max_beta)) {
        int which = o->beta1 > bf16_max_beta ? 1 : 2;
        double beta = which == 1 ? o->beta1 : o->beta2;
        snprintf(hint, sizeof hint,
                 "use optim.moments: fp32 (the default) with this beta, or optim.beta%d <= %g",
                 which, bf16_max_beta);
        return rule_fail(err, bad, "optim.moments", which == 1 ? "optim.beta1" : "optim.beta2",
                         hint,
                         "optim.moments bf16 needs optim.beta%d <= %g, got %g (a decay 1 - "
                         "beta%d = %.3g): a bf16 moment keeps 8 significant bits, so a step that "
                         "changes it by less than half an ulp (2^-9 to 2^-8 of its value) leaves "
                         "it as it was, and with a decay this small most or all of each step's "
                         "change is lost to rounding",
                         which, bf16_max_beta, beta, which, 1.0 - beta);
    }
    return MOE_OK;
}

void moe_config_micro_batch(const moe_config *c, int64_t *seqs, int64_t *count) {
    const moe_train_config *t = &c->train;
    int64_t micro = t->micro_batch_tokens
                        ? t->micro_batch_tokens
                        : t->global_batch_tokens / (c->parallel.dp * c->parallel.ep);
    *seqs = micro / t->seq_len;
    *count = t->global_batch_tokens / micro;
}

moe_status moe_config_validate(const moe_config *c, moe_err *err) {
    const char *bad[2];
    return validate(c, err, bad);
}

/* ---- loading --------------------------------------------------------------------------- */

static moe_status load(moe_config *c, const char *name, const char *text, size_t len,
                       int n_overrides, char *const *overrides, moe_err *err) {
    moe_config_defaults(c);
    cfg_loader L = {c, name ? name : "<string>", NULL, NULL};
    L.origin = calloc((size_t)moe_cfg_n_keys, sizeof *L.origin);
    if (!L.origin) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    moe_status st = text ? load_text(&L, text, len, err) : MOE_OK;
    for (int i = 0; st == MOE_OK && i < n_overrides; i++) {
        const char *ov = overrides[i];
        const char *eq = strchr(ov, '=');
        char key[256];
        if (!eq || eq == ov || (size_t)(eq - ov) >= sizeof key) {
            st =
                moe_err_set(err, MOE_ERR_INPUT, NULL, "override '%s': expected key.path=value", ov);
            moe_err_hint(err, "e.g. train.steps=100 model.num_hidden_layers=4");
            break;
        }
        snprintf(key, sizeof key, "%.*s", (int)(eq - ov), ov);
        st = set_key(c, key, eq + 1, err);
        if (st) {
            moe_err_prefix(err, "override '%s'", ov);
            break;
        }
        cfg_origin *o = &L.origin[moe_cfg_find(key) - moe_cfg_keys];
        o->from_file = 2;
        o->override_index = i;
    }
    if (st == MOE_OK) {
        const char *bad[2];
        st = validate(c, err, bad);
        /* Point at whichever of the keys involved the user wrote. */
        for (int j = 0; st && err && j < 2 && bad[j]; j++) {
            const moe_cfg_key *k = moe_cfg_find(bad[j]);
            cfg_origin *o = &L.origin[k - moe_cfg_keys];
            if (o->from_file == 1) {
                snprintf(err->file, sizeof err->file, "%s", L.name);
                moe_err_at_line(err, o->line, o->col);
                break;
            }
            if (o->from_file == 2) {
                moe_err_prefix(err, "after override '%s'", overrides[o->override_index]);
                break;
            }
        }
    }
    free(L.origin);
    return st;
}

moe_status moe_config_load(moe_config *c, const char *path, int n_overrides, char *const *overrides,
                           moe_err *err) {
    char *text = NULL;
    size_t len = 0;
    if (path) {
        moe_status st = moe_read_file(path, &text, &len, err);
        if (st) {
            moe_config_defaults(c);
            return st;
        }
    }
    moe_status st = load(c, path, text, len, n_overrides, overrides, err);
    free(text);
    return st;
}

moe_status moe_config_load_string(moe_config *c, const char *yaml, const char *name, moe_err *err) {
    return load(c, name, yaml, strlen(yaml), 0, NULL, err);
}
