/* The HTTP front's command-line options (gw_cli.h). */
#include "gw_cli.h"

void gwc_opts(const struct gwc_cfg *c, struct gw_auth *auth, int vision, struct gw_opts *go,
	      struct img_limits *il)
{
	*go = (struct gw_opts){0};
	go->host = c->host;
	go->port = (uint16_t)c->port;
	go->model_id = c->model_id;
	go->chat_template = c->tmpl;
	go->limits.max_tokens = (int)c->max_tokens;
	go->auth = auth;
	go->tls_cert = c->tls_cert[0] ? c->tls_cert : NULL;
	go->tls_key = c->tls_key[0] ? c->tls_key : NULL;
	go->max_conns = (unsigned)c->max_conns;
	go->max_conns_per_address = (unsigned)c->max_conns_per_address;
	go->max_body = (size_t)c->max_body;
	go->limits.max_images = (int)c->max_images;
	go->limits.max_image_pixels_total = (uint64_t)c->image_max_total_pixels;
	*il = (struct img_limits){.max_bytes = (size_t)c->image_max_bytes,
				  .max_width = (uint32_t)c->image_max_side,
				  .max_height = (uint32_t)c->image_max_side,
				  .max_pixels = (uint64_t)c->image_max_pixels,
				  .allow_fetch = c->image_fetch};
	go->limits.img = il;
	go->vision = vision;
}
