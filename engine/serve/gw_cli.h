/* gw_cli — the HTTP front's command-line options and their gw_opts, shared by `kvinfer serve`
 * (serve_main.c) and `kvinfer gateway` (gw_main.c). Private to the kvinfer binary. */
#ifndef KVFS_GW_CLI_H
#define KVFS_GW_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "cfg.h"
#include "gw.h"
#include "img.h"

/* The options, a member of the command's own config struct (cfg.h fills it by offset). */
struct gwc_cfg {
	char host[CFG_STR_MAX];
	int64_t port;
	char port_file[CFG_STR_MAX];
	char model_id[CFG_STR_MAX];
	char tmpl[CFG_STR_MAX];
	int64_t max_tokens;
	char api_keys[CFG_STR_MAX];
	char tenant_secret[CFG_STR_MAX];
	int open_gateway;
	char tls_cert[CFG_STR_MAX], tls_key[CFG_STR_MAX];
	int64_t max_conns, max_conns_per_address;
	uint64_t max_body, image_max_bytes;
	int64_t max_images, image_max_side, image_max_pixels, image_max_total_pixels;
	int image_fetch;
};

/* cfg_opt entries for a struct gwc_cfg at byte offset `at` of the command's config struct, in
 * three runs so that each command keeps its own --help order around them. */
#define GWC_OFF(at, f) ((at) + offsetof(struct gwc_cfg, f))
#define GWC_OPTS_LISTEN(at)                                                                        \
	{"host", CFG_STR, GWC_OFF(at, host), 0, 0, "127.0.0.1", "listen address"},                 \
	    {"port", CFG_INT, GWC_OFF(at, port), 0, 65535, "8080", "listen port, 0 = ephemeral"},  \
	{                                                                                          \
		"port-file", CFG_STR, GWC_OFF(at, port_file), 0, 0, NULL,                          \
		    "write the bound port here"                                                    \
	}
#define GWC_OPTS_API(at)                                                                             \
	{"model-id",                                                                                 \
	 CFG_STR,                                                                                    \
	 GWC_OFF(at, model_id),                                                                      \
	 0,                                                                                          \
	 0,                                                                                          \
	 "kvinfer",                                                                                  \
	 "model names the API serves, comma-separated (the first is the default)"},                  \
	    {"chat-template", CFG_STR, GWC_OFF(at, tmpl), 0, 0, "plain", "chatml, llama3 or plain"}, \
	{                                                                                            \
		"max-tokens", CFG_INT, GWC_OFF(at, max_tokens), 1, 1 << 20, "4096",                  \
		    "largest max_tokens"                                                             \
	}
#define GWC_OPTS_ACCESS(at)                                                                        \
	{"api-keys",                                                                               \
	 CFG_STR,                                                                                  \
	 GWC_OFF(at, api_keys),                                                                    \
	 0,                                                                                        \
	 0,                                                                                        \
	 NULL,                                                                                     \
	 "API key file: '<key> <tenant>' lines (docs/serving.md); reread on SIGHUP or a change"},  \
	    {"tenant-secret-file",                                                                 \
	     CFG_STR,                                                                              \
	     GWC_OFF(at, tenant_secret),                                                           \
	     0,                                                                                    \
	     0,                                                                                    \
	     NULL,                                                                                 \
	     "secret the tenants' cache salts are derived from (16..4096 bytes)"},                 \
	    {"open-gateway",                                                                       \
	     CFG_BOOL,                                                                             \
	     GWC_OFF(at, open_gateway),                                                            \
	     0,                                                                                    \
	     0,                                                                                    \
	     "false",                                                                              \
	     "no API keys: anyone who reaches the port may call /v1, with one shared cache"},      \
	    {"tls-cert",                                                                           \
	     CFG_STR,                                                                              \
	     GWC_OFF(at, tls_cert),                                                                \
	     0,                                                                                    \
	     0,                                                                                    \
	     NULL,                                                                                 \
	     "serve HTTPS with this PEM certificate chain (and --tls-key)"},                       \
	    {"tls-key",                                                                            \
	     CFG_STR,                                                                              \
	     GWC_OFF(at, tls_key),                                                                 \
	     0,                                                                                    \
	     0,                                                                                    \
	     NULL,                                                                                 \
	     "the PEM private key of --tls-cert"},                                                 \
	    {"max-conns",                                                                          \
	     CFG_INT,                                                                              \
	     GWC_OFF(at, max_conns),                                                               \
	     1,                                                                                    \
	     100000,                                                                               \
	     "512",                                                                                \
	     "HTTP connections at most (one thread each); loopback has 16 more"},                  \
	    {"max-conns-per-address",                                                              \
	     CFG_INT,                                                                              \
	     GWC_OFF(at, max_conns_per_address),                                                   \
	     1,                                                                                    \
	     100000,                                                                               \
	     "64",                                                                                 \
	     "HTTP connections at most from one client address"},                                  \
	    {"max-body",                                                                           \
	     CFG_SIZE,                                                                             \
	     GWC_OFF(at, max_body),                                                                \
	     4096,                                                                                 \
	     1 << 30,                                                                              \
	     "1M",                                                                                 \
	     "largest request body (images come base64 in it)"},                                   \
	    {"max-images",   CFG_INT, GWC_OFF(at, max_images),	      1,                           \
	     OAI_MAX_IMAGES, "8",     "images in one request at most"},                            \
	    {"image-max-bytes",                                                                    \
	     CFG_SIZE,                                                                             \
	     GWC_OFF(at, image_max_bytes),                                                         \
	     1,                                                                                    \
	     1 << 30,                                                                              \
	     "20M",                                                                                \
	     "largest encoded image (PNG, JPEG, WebP)"},                                           \
	    {"image-max-side",                                                                     \
	     CFG_INT,                                                                              \
	     GWC_OFF(at, image_max_side),                                                          \
	     1,                                                                                    \
	     1 << 20,                                                                              \
	     "8192",                                                                               \
	     "largest image width or height, from its header"},                                    \
	    {"image-max-pixels",                                                                   \
	     CFG_INT,                                                                              \
	     GWC_OFF(at, image_max_pixels),                                                        \
	     1,                                                                                    \
	     1LL << 32,                                                                            \
	     "16777216",                                                                           \
	     "largest image width x height, from its header (decompression bombs)"},               \
	    {"image-max-total-pixels",                                                             \
	     CFG_INT,                                                                              \
	     GWC_OFF(at, image_max_total_pixels),                                                  \
	     1,                                                                                    \
	     1LL << 36,                                                                            \
	     "33554432",                                                                           \
	     "largest width x height of all images of one request together"},                      \
	{                                                                                          \
		"image-fetch", CFG_BOOL, GWC_OFF(at, image_fetch), 0, 0, "false",                  \
		    "let http(s) image URLs through the URL check (fetching is not implemented)"   \
	}

/* The gw_opts c asks for: listen address, API names and limits, TLS, connection and image
 * limits. *il is filled and go->limits.img points at it (gw_start copies it); go->auth = auth
 * (not owned), go->vision = vision; every other field zero. go's strings point into c. */
void gwc_opts(const struct gwc_cfg *c, struct gw_auth *auth, int vision, struct gw_opts *go,
	      struct img_limits *il);

#endif
