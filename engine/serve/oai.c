#include "oai.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(char *err, size_t errlen, const char **param, const char *p, int rc,
		const char *fmt, const char *a)
{
	if (err && errlen)
		snprintf(err, errlen, fmt, a ? a : "");
	if (param)
		*param = p;
	return rc;
}

/* Length of the well-formed UTF-8 sequence at s[0..n) (1-4), or 0 if it is not one: a stray
 * continuation byte, an overlong form, a surrogate, a code point past U+10FFFF, or a sequence
 * cut short (RFC 3629). */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
	unsigned c = s[0];
	if (c < 0x80)
		return 1;
	size_t len = c >= 0xC2 && c <= 0xDF   ? 2
		     : c >= 0xE0 && c <= 0xEF ? 3
		     : c >= 0xF0 && c <= 0xF4 ? 4
					      : 0;
	if (!len || n < len)
		return 0;
	/* The second byte's range depends on the first (no overlongs, surrogates or > U+10FFFF). */
	unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
	unsigned hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
	if (s[1] < lo || s[1] > hi)
		return 0;
	for (size_t i = 2; i < len; i++)
		if ((s[i] & 0xC0) != 0x80)
			return 0;
	return len;
}

static int utf8_valid(const char *s, size_t n)
{
	for (size_t i = 0, k; i < n; i += k)
		if (!(k = utf8_seq((const unsigned char *)s + i, n - i)))
			return 0;
	return 1;
}

/* Adds text as a JSON string. Generated text can hold bytes that are not UTF-8 (a byte-level
 * token sampled on its own); each such byte becomes U+FFFD, so the response stays valid JSON,
 * which must be UTF-8 (RFC 8259). */
static void add_text(cJSON *o, const char *key, const char *text)
{
	size_t n = strlen(text);
	if (utf8_valid(text, n)) {
		cJSON_AddStringToObject(o, key, text);
		return;
	}
	char *fixed = malloc(3 * n + 1), *w = fixed;
	if (!fixed)
		return; /* out of memory: the key is left out, as by any failing cJSON_Add */
	for (size_t i = 0, k; i < n; i += k) {
		k = utf8_seq((const unsigned char *)text + i, n - i);
		if (k) {
			memcpy(w, text + i, k);
			w += k;
		} else {
			memcpy(w, "\xEF\xBF\xBD", 3);
			w += 3;
			k = 1;
		}
	}
	*w = 0;
	cJSON_AddStringToObject(o, key, fixed);
	free(fixed);
}

static char *dup_str(const char *s)
{
	size_t n = strlen(s);
	char *d = malloc(n + 1);
	if (d)
		memcpy(d, s, n + 1);
	return d;
}

/* Reads an optional string field; -EINVAL if present with another type (null = absent). */
static int opt_string(const cJSON *o, const char *name, char **out)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
	if (!v || cJSON_IsNull(v))
		return 0;
	if (!cJSON_IsString(v))
		return -EINVAL;
	*out = dup_str(v->valuestring);
	return *out ? 0 : -ENOMEM;
}

static int opt_number(const cJSON *o, const char *name, double lo, double hi, double *out,
		      int *present)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
	if (present)
		*present = 0;
	if (!v || cJSON_IsNull(v))
		return 0;
	if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo ||
	    v->valuedouble > hi)
		return -EINVAL;
	*out = v->valuedouble;
	if (present)
		*present = 1;
	return 0;
}

static int opt_bool(const cJSON *o, const char *name, int *out)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
	if (!v || cJSON_IsNull(v))
		return 0;
	if (!cJSON_IsBool(v))
		return -EINVAL;
	*out = cJSON_IsTrue(v);
	return 0;
}

/* A message's content: a string, or an array of {"type":"text","text":...} parts. */
static int content_text(const cJSON *c, char **out)
{
	if (cJSON_IsString(c)) {
		*out = dup_str(c->valuestring);
		return *out ? 0 : -ENOMEM;
	}
	if (!cJSON_IsArray(c))
		return -EINVAL;
	size_t total = 0;
	const cJSON *part;
	cJSON_ArrayForEach(part, c)
	{
		const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
		const cJSON *ty = cJSON_GetObjectItemCaseSensitive(part, "type");
		if (!cJSON_IsObject(part) || !cJSON_IsString(t) ||
		    (ty && (!cJSON_IsString(ty) || strcmp(ty->valuestring, "text") != 0)))
			return -EINVAL;
		total += strlen(t->valuestring);
	}
	char *s = malloc(total + 1), *p = s;
	if (!s)
		return -ENOMEM;
	cJSON_ArrayForEach(part, c)
	{
		const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
		size_t n = strlen(t);
		memcpy(p, t, n);
		p += n;
	}
	*p = 0;
	*out = s;
	return 0;
}

int oai_parse_request(const char *body, size_t len, int chat, const struct oai_limits *lim,
		      struct oai_request *r, char *err, size_t errlen, const char **param)
{
	memset(r, 0, sizeof(*r));
	r->chat = chat;
	r->temperature = 1.0;
	r->top_p = 1.0;
	r->max_tokens = lim->default_max_tokens;
	if (param)
		*param = NULL;
	if (!body || len == 0)
		return fail(err, errlen, param, NULL, -EINVAL, "request body is empty%s", NULL);
	if (memchr(body, 0, len))
		return fail(err, errlen, param, NULL, -EINVAL, "request body contains a NUL byte%s",
			    NULL);
	/* JSON text is UTF-8 (RFC 8259); cJSON passes other bytes through into the strings. */
	if (!utf8_valid(body, len))
		return fail(err, errlen, param, NULL, -EINVAL, "request body is not valid UTF-8%s",
			    NULL);
	cJSON *o = cJSON_ParseWithLength(body, len);
	if (!o)
		return fail(err, errlen, param, NULL, -EINVAL, "request body is not valid JSON%s",
			    NULL);
	int rc = 0;
	const char *p = NULL;
	size_t prompt_bytes = 0;
	if (!cJSON_IsObject(o)) {
		rc = fail(err, errlen, param, NULL, -EINVAL, "request body must be a JSON object%s",
			  NULL);
		goto out;
	}
	if (opt_string(o, "model", &r->model)) {
		p = "model";
		goto bad_type;
	}
	if (chat) {
		const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages");
		p = "messages";
		if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0) {
			rc = fail(err, errlen, param, p, -EINVAL,
				  "'messages' must be a non-empty array%s", NULL);
			goto out;
		}
		int n = cJSON_GetArraySize(msgs);
		if (n > lim->max_messages) {
			rc = fail(err, errlen, param, p, -E2BIG, "too many messages%s", NULL);
			goto out;
		}
		r->messages = calloc((size_t)n, sizeof(*r->messages));
		if (!r->messages) {
			rc = -ENOMEM;
			goto out;
		}
		const cJSON *m;
		cJSON_ArrayForEach(m, msgs)
		{
			struct oai_message *dst = &r->messages[r->n_messages++];
			const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
			const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
			if (!cJSON_IsObject(m) || !cJSON_IsString(role) ||
			    (strcmp(role->valuestring, "system") != 0 &&
			     strcmp(role->valuestring, "user") != 0 &&
			     strcmp(role->valuestring, "assistant") != 0 &&
			     strcmp(role->valuestring, "developer") != 0)) {
				rc = fail(err, errlen, param, p, -EINVAL,
					  "each message needs a 'role' of system, user or "
					  "assistant%s",
					  NULL);
				goto out;
			}
			dst->role = dup_str(role->valuestring);
			if (!dst->role || !content || content_text(content, &dst->content)) {
				rc = fail(err, errlen, param, p, -EINVAL,
					  "each message needs a 'content' string%s", NULL);
				goto out;
			}
			prompt_bytes += strlen(dst->content);
		}
	} else {
		const cJSON *pr = cJSON_GetObjectItemCaseSensitive(o, "prompt");
		p = "prompt";
		/* A string, or an array holding exactly one string. */
		if (cJSON_IsArray(pr) && cJSON_GetArraySize(pr) == 1)
			pr = cJSON_GetArrayItem(pr, 0);
		if (!cJSON_IsString(pr)) {
			rc = fail(err, errlen, param, p, -EINVAL,
				  "'prompt' must be a string (or an array of one string)%s", NULL);
			goto out;
		}
		r->prompt = dup_str(pr->valuestring);
		if (!r->prompt) {
			rc = -ENOMEM;
			goto out;
		}
		prompt_bytes = strlen(r->prompt);
	}
	if (prompt_bytes > lim->max_prompt_bytes) {
		rc = fail(err, errlen, param, p, -E2BIG,
			  "prompt is longer than this server allows%s", NULL);
		goto out;
	}

	double d;
	int present;
	p = "max_tokens";
	const cJSON *mct = cJSON_GetObjectItemCaseSensitive(o, "max_completion_tokens");
	const char *mt = mct && !cJSON_IsNull(mct) ? "max_completion_tokens" : "max_tokens";
	if (opt_number(o, mt, 1, lim->max_tokens, &d, &present) || (present && d != floor(d))) {
		char range[64];
		snprintf(range, sizeof(range), "%d", lim->max_tokens);
		rc = fail(err, errlen, param, mt, -EINVAL,
			  "max_tokens must be an integer between 1 and %s", range);
		goto out;
	}
	if (present)
		r->max_tokens = (int)d;
	p = "temperature";
	if (opt_number(o, p, 0, 2, &r->temperature, NULL))
		goto bad_range;
	p = "top_p";
	if (opt_number(o, p, 0, 1, &r->top_p, NULL))
		goto bad_range;
	p = "top_k";
	if (opt_number(o, p, 0, 1000000, &d, &present) || (present && d != floor(d)))
		goto bad_range;
	if (present)
		r->top_k = (int)d;
	p = "seed";
	if (opt_number(o, p, -9.2e18, 9.2e18, &d, &present) || (present && d != floor(d)))
		goto bad_range;
	if (present) {
		r->has_seed = 1;
		r->seed = (uint64_t)(int64_t)d;
	}
	p = "n";
	if (opt_number(o, p, 1, 1, &d, NULL)) {
		rc = fail(err, errlen, param, p, -EINVAL, "only n = 1 is supported%s", NULL);
		goto out;
	}
	p = "stream";
	if (opt_bool(o, p, &r->stream))
		goto bad_type;
	const cJSON *so = cJSON_GetObjectItemCaseSensitive(o, "stream_options");
	if (so && !cJSON_IsNull(so)) {
		p = "stream_options";
		if (!cJSON_IsObject(so) || opt_bool(so, "include_usage", &r->include_usage))
			goto bad_type;
	}
	const cJSON *stop = cJSON_GetObjectItemCaseSensitive(o, "stop");
	p = "stop";
	if (cJSON_IsString(stop)) {
		if (!*stop->valuestring)
			goto bad_range;
		r->stop[r->n_stop++] = dup_str(stop->valuestring);
	} else if (cJSON_IsArray(stop)) {
		if (cJSON_GetArraySize(stop) > OAI_MAX_STOP)
			goto bad_range;
		const cJSON *s;
		cJSON_ArrayForEach(s, stop)
		{
			if (!cJSON_IsString(s) || !*s->valuestring)
				goto bad_type;
			r->stop[r->n_stop++] = dup_str(s->valuestring);
		}
	} else if (stop && !cJSON_IsNull(stop)) {
		goto bad_type;
	}
	for (int i = 0; i < r->n_stop; i++)
		if (!r->stop[i]) {
			rc = -ENOMEM;
			goto out;
		}
	p = "cache_salt";
	if (opt_string(o, p, &r->salt))
		goto bad_type;
	if (!r->salt) {
		p = "user";
		if (opt_string(o, p, &r->salt))
			goto bad_type;
	}
	if (r->salt && strlen(r->salt) > OAI_MAX_SALT) {
		rc = fail(err, errlen, param, p, -EINVAL, "'%s' is longer than 255 bytes", p);
		goto out;
	}
	goto out;

bad_type:
	rc = fail(err, errlen, param, p, -EINVAL, "'%s' has the wrong type", p);
	goto out;
bad_range:
	rc = fail(err, errlen, param, p, -EINVAL, "'%s' is out of range", p);
out:
	cJSON_Delete(o);
	if (rc)
		oai_request_free(r);
	return rc;
}

void oai_request_free(struct oai_request *r)
{
	free(r->model);
	free(r->prompt);
	for (int i = 0; i < r->n_messages; i++) {
		free(r->messages[i].role);
		free(r->messages[i].content);
	}
	free(r->messages);
	for (int i = 0; i < r->n_stop; i++)
		free(r->stop[i]);
	free(r->salt);
	int chat = r->chat;
	memset(r, 0, sizeof(*r));
	r->chat = chat;
}

struct sbuf {
	char *p;
	size_t len, cap;
	int err;
};

static void sb_put(struct sbuf *b, const char *s)
{
	size_t n = strlen(s);
	if (b->err)
		return;
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->len + n + 1)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (!p) {
			b->err = 1;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n + 1);
	b->len += n;
}

int oai_render_chat(const struct oai_request *r, const char *tmpl, char **out)
{
	struct sbuf b = {0};
	int kind = 0;
	if (!tmpl || strcmp(tmpl, "plain") == 0)
		kind = 0;
	else if (strcmp(tmpl, "chatml") == 0)
		kind = 1;
	else if (strcmp(tmpl, "llama3") == 0)
		kind = 2;
	else
		return -EINVAL;
	for (int i = 0; i < r->n_messages; i++) {
		const struct oai_message *m = &r->messages[i];
		const char *role = strcmp(m->role, "developer") == 0 ? "system" : m->role;
		if (kind == 1) {
			sb_put(&b, "<|im_start|>");
			sb_put(&b, role);
			sb_put(&b, "\n");
			sb_put(&b, m->content);
			sb_put(&b, "<|im_end|>\n");
		} else if (kind == 2) {
			sb_put(&b, "<|start_header_id|>");
			sb_put(&b, role);
			sb_put(&b, "<|end_header_id|>\n\n");
			sb_put(&b, m->content);
			sb_put(&b, "<|eot_id|>");
		} else {
			char cap[16];
			snprintf(cap, sizeof(cap), "%c%s", role[0] - 32, role + 1);
			sb_put(&b, cap);
			sb_put(&b, ": ");
			sb_put(&b, m->content);
			sb_put(&b, "\n");
		}
	}
	sb_put(&b, kind == 1   ? "<|im_start|>assistant\n"
		   : kind == 2 ? "<|start_header_id|>assistant<|end_header_id|>\n\n"
			       : "Assistant:");
	if (b.err) {
		free(b.p);
		return -ENOMEM;
	}
	*out = b.p;
	return 0;
}

static char *print(cJSON *o)
{
	char *s = o ? cJSON_PrintUnformatted(o) : NULL;
	cJSON_Delete(o);
	return s;
}

char *oai_error_json(const char *message, const char *type, const char *param, const char *code)
{
	cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
	cJSON_AddStringToObject(e, "message", message ? message : "");
	cJSON_AddStringToObject(e, "type", type ? type : "invalid_request_error");
	if (param)
		cJSON_AddStringToObject(e, "param", param);
	else
		cJSON_AddNullToObject(e, "param");
	if (code)
		cJSON_AddStringToObject(e, "code", code);
	else
		cJSON_AddNullToObject(e, "code");
	return print(o);
}

static void add_usage(cJSON *o, const struct oai_usage *u)
{
	cJSON *us = cJSON_AddObjectToObject(o, "usage");
	cJSON_AddNumberToObject(us, "prompt_tokens", u->prompt_tokens);
	cJSON_AddNumberToObject(us, "completion_tokens", u->completion_tokens);
	cJSON_AddNumberToObject(us, "total_tokens", u->prompt_tokens + u->completion_tokens);
	cJSON *d = cJSON_AddObjectToObject(us, "prompt_tokens_details");
	cJSON_AddNumberToObject(d, "cached_tokens", u->cached_tokens);
}

static cJSON *head(int chat, int chunk, const char *id, const char *model, int64_t created)
{
	cJSON *o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "id", id);
	cJSON_AddStringToObject(o, "object",
				chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
				     : "text_completion");
	cJSON_AddNumberToObject(o, "created", (double)created);
	cJSON_AddStringToObject(o, "model", model ? model : "");
	return o;
}

char *oai_response_json(int chat, const char *id, const char *model, int64_t created,
			const char *text, const char *finish_reason, const struct oai_usage *u)
{
	cJSON *o = head(chat, 0, id, model, created);
	cJSON *ch = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
	cJSON_AddItemToArray(ch, c);
	cJSON_AddNumberToObject(c, "index", 0);
	if (chat) {
		cJSON *m = cJSON_AddObjectToObject(c, "message");
		cJSON_AddStringToObject(m, "role", "assistant");
		add_text(m, "content", text ? text : "");
	} else {
		add_text(c, "text", text ? text : "");
		cJSON_AddNullToObject(c, "logprobs");
	}
	cJSON_AddStringToObject(c, "finish_reason", finish_reason ? finish_reason : "stop");
	add_usage(o, u);
	return print(o);
}

char *oai_chunk_json(int chat, const char *id, const char *model, int64_t created, const char *text,
		     const char *finish_reason, const struct oai_usage *u)
{
	cJSON *o = head(chat, 1, id, model, created);
	cJSON *ch = cJSON_AddArrayToObject(o, "choices");
	if (text || finish_reason) {
		cJSON *c = cJSON_CreateObject();
		cJSON_AddItemToArray(ch, c);
		cJSON_AddNumberToObject(c, "index", 0);
		if (chat) {
			cJSON *d = cJSON_AddObjectToObject(c, "delta");
			if (text)
				add_text(d, "content", text);
		} else {
			add_text(c, "text", text ? text : "");
		}
		if (finish_reason)
			cJSON_AddStringToObject(c, "finish_reason", finish_reason);
		else
			cJSON_AddNullToObject(c, "finish_reason");
	}
	if (u)
		add_usage(o, u);
	return print(o);
}

char *oai_models_json(const char *const *ids, int n, int64_t created)
{
	cJSON *o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "object", "list");
	cJSON *d = cJSON_AddArrayToObject(o, "data");
	for (int i = 0; i < n; i++) {
		cJSON *m = cJSON_CreateObject();
		cJSON_AddStringToObject(m, "id", ids[i]);
		cJSON_AddStringToObject(m, "object", "model");
		cJSON_AddNumberToObject(m, "created", (double)created);
		cJSON_AddStringToObject(m, "owned_by", "kvfs");
		cJSON_AddItemToArray(d, m);
	}
	return print(o);
}
