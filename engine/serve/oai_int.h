/* oai_int — what oai.c (parsing) and oai_write.c (responses) share. Not for other modules. */
#ifndef KVFS_OAI_INT_H
#define KVFS_OAI_INT_H

#include <cjson/cJSON.h>

/* Adds text to o under key as a JSON string; bytes that are not UTF-8 (a byte-level token
 * sampled on its own) become U+FFFD each, so the JSON stays valid UTF-8 (RFC 8259). On
 * allocation failure the key is left out, as by any failing cJSON_Add. */
void oai_add_text(cJSON *o, const char *key, const char *text);

#endif
