/* config_schema: the private schema table behind moe/config.h, shared by config.c (YAML
 * loading, overrides, validation) and config_schema.c (defaults, YAML and Markdown output).
 *
 * One row per key. The row says where the value lives in moe_config (offset, size), how its
 * text is parsed (type), its default as text (parsed by the same code as a file value, so
 * docs and behaviour cannot drift) and its allowed range or values. */
#ifndef MOE_CONFIG_SCHEMA_H
#define MOE_CONFIG_SCHEMA_H

#include <stddef.h>
#include <stdint.h>

#include "moe/config.h"

typedef enum moe_cfg_type {
    MOE_CFG_INT,    /* int64_t */
    MOE_CFG_FLOAT,  /* double, finite */
    MOE_CFG_BOOL,   /* bool */
    MOE_CFG_STRING, /* char[size], NUL-terminated */
    MOE_CFG_ENUM,   /* a C enum (int-sized) indexing `values` */
} moe_cfg_type;

/* Range flags for MOE_CFG_INT / MOE_CFG_FLOAT rows. */
enum {
    MOE_CFG_HAS_MIN = 1,
    MOE_CFG_HAS_MAX = 2,
    MOE_CFG_MIN_EXCL = 4, /* value > min instead of >= */
    MOE_CFG_MAX_EXCL = 8, /* value < max instead of <= */
};

typedef struct moe_cfg_key {
    const char *key; /* dotted path: "train.steps", or "device" at the top level */
    moe_cfg_type type;
    size_t offset, size; /* of the field in moe_config */
    const char *def;     /* default, as it would be written in YAML */
    unsigned range;      /* MOE_CFG_HAS_MIN | ... */
    double min, max;
    const char *const *values; /* MOE_CFG_ENUM: NULL-terminated names, index = enum value */
    const char *doc;           /* one line */
} moe_cfg_key;

typedef struct moe_cfg_section {
    const char *name; /* "model"; "" for the top-level keys */
    const char *doc;
} moe_cfg_section;

extern const moe_cfg_key moe_cfg_keys[];
extern const int moe_cfg_n_keys;
extern const moe_cfg_section moe_cfg_sections[];
extern const int moe_cfg_n_sections;

/* Row for a dotted key, NULL when unknown. */
const moe_cfg_key *moe_cfg_find(const char *dotted);
/* Part of the key after the section ("steps" for "train.steps", "device" for "device"). */
const char *moe_cfg_leaf(const moe_cfg_key *k);
/* 1 when the key's section is `section` ("" = top level). */
int moe_cfg_in_section(const moe_cfg_key *k, const char *section);
/* Human-readable allowed values: "1 .. 1024", "> 0", "[0, 1)", "cosine, linear, constant". */
void moe_cfg_format_allowed(const moe_cfg_key *k, char *buf, size_t n, int markdown);
/* Current value of the key in c, as YAML text (strings double-quoted and escaped). */
void moe_cfg_format_value(const moe_cfg_key *k, const moe_config *c, char *buf, size_t n);
/* Shortest "%.{15,16,17}g" text that parses back to exactly v, with ".0" added when it would
 * otherwise read as an integer. */
void moe_cfg_format_double(double v, char *buf, size_t n);
/* Parses text into the key's field of c (no range check); 0 on success, else -1 with a
 * message "expected ..., got ..." in why. */
int moe_cfg_parse_value(const moe_cfg_key *k, moe_config *c, const char *text, size_t len,
                        char *why, size_t why_n);
/* Range/allowed-value check of the key's field in c; 0 when fine, else -1 and a message. */
int moe_cfg_check_range(const moe_cfg_key *k, const moe_config *c, char *why, size_t why_n);

#endif
