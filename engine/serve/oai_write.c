/* oai_write.c: OpenAI's response JSON (oai.h's writers); oai.c: request parsing. */
#include "oai.h"
#include "oai_int.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* A token's bytes as OpenAI's "bytes": the UTF-8 (or raw) bytes of its text. */
static cJSON *token_bytes(const char *t)
{
	cJSON *a = cJSON_CreateArray();
	for (const unsigned char *p = (const unsigned char *)t; *p; p++)
		cJSON_AddItemToArray(a, cJSON_CreateNumber(*p));
	return a;
}

/* A float as JSON: the shortest decimal that reads back to the same float ("-0.0559661", not
 * cJSON's %1.17g of the widened double, "-0.055966100000000005"); -inf (a token banned by
 * logit_bias) and any other non-finite value as -9999, as OpenAI does for tokens it never
 * samples, since JSON has no infinity or NaN. */
static cJSON *float_json(float v)
{
	char b[32];
	if (!isfinite(v))
		return cJSON_CreateRaw("-9999");
	for (int prec = 1; prec <= 9; prec++) { /* FLT_DECIMAL_DIG = 9 always round-trips */
		snprintf(b, sizeof(b), "%.*g", prec, (double)v);
		if (strtof(b, NULL) == v)
			break;
	}
	return cJSON_CreateRaw(b);
}

static void add_float(cJSON *o, const char *key, float v)
{
	cJSON_AddItemToObject(o, key, float_json(v));
}

/* chat: {"content": [{"token","logprob","bytes","top_logprobs":[...]}], "refusal": null} */
static cJSON *chat_logprobs(const struct oai_lp_entry *e, int n)
{
	cJSON *o = cJSON_CreateObject(), *content = cJSON_AddArrayToObject(o, "content");
	for (int i = 0; i < n; i++) {
		cJSON *t = cJSON_CreateObject();
		oai_add_text(t, "token", e[i].token);
		add_float(t, "logprob", e[i].logprob);
		cJSON_AddItemToObject(t, "bytes", token_bytes(e[i].token));
		cJSON *top = cJSON_AddArrayToObject(t, "top_logprobs");
		for (int k = 0; k < e[i].n_top; k++) {
			cJSON *x = cJSON_CreateObject();
			oai_add_text(x, "token", e[i].top[k].token);
			add_float(x, "logprob", e[i].top[k].logprob);
			cJSON_AddItemToObject(x, "bytes", token_bytes(e[i].top[k].token));
			cJSON_AddItemToArray(top, x);
		}
		cJSON_AddItemToArray(content, t);
	}
	cJSON_AddNullToObject(o, "refusal");
	return o;
}

/* completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}
 * (offsets from base: the echoed prompt's length, or 0). */
static cJSON *text_logprobs(const struct oai_lp_entry *e, int n, int base)
{
	cJSON *o = cJSON_CreateObject();
	cJSON *toks = cJSON_AddArrayToObject(o, "tokens");
	cJSON *lps = cJSON_AddArrayToObject(o, "token_logprobs");
	cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs");
	cJSON *offs = cJSON_AddArrayToObject(o, "text_offset");
	for (int i = 0; i < n; i++) {
		cJSON *t = cJSON_CreateObject();
		oai_add_text(t, "t", e[i].token);
		cJSON *ts = cJSON_DetachItemFromObject(t, "t");
		cJSON_Delete(t);
		cJSON_AddItemToArray(toks, ts ? ts : cJSON_CreateString(""));
		cJSON_AddItemToArray(lps, float_json(e[i].logprob));
		cJSON *top = cJSON_CreateObject();
		for (int k = 0; k < e[i].n_top; k++)
			if (!cJSON_GetObjectItemCaseSensitive(top, e[i].top[k].token))
				add_float(top, e[i].top[k].token, e[i].top[k].logprob);
		cJSON_AddItemToArray(tops, top);
		cJSON_AddItemToArray(offs, cJSON_CreateNumber(base + e[i].text_offset));
	}
	return o;
}

static void add_choice_logprobs(cJSON *c, int chat, const struct oai_choice *ch)
{
	if (!ch->has_lp)
		cJSON_AddNullToObject(c, "logprobs");
	else
		cJSON_AddItemToObject(c, "logprobs",
				      chat ? chat_logprobs(ch->lp, ch->n_lp)
					   : text_logprobs(ch->lp, ch->n_lp, ch->lp_base));
}

char *oai_response_choices_json(int chat, const char *id, const char *model, int64_t created,
				const struct oai_choice *chs, int n, const struct oai_usage *u)
{
	cJSON *o = head(chat, 0, id, model, created);
	cJSON *arr = cJSON_AddArrayToObject(o, "choices");
	for (int i = 0; i < n; i++) {
		const struct oai_choice *ch = &chs[i];
		cJSON *c = cJSON_CreateObject();
		cJSON_AddItemToArray(arr, c);
		cJSON_AddNumberToObject(c, "index", ch->index);
		if (chat) {
			cJSON *m = cJSON_AddObjectToObject(c, "message");
			cJSON_AddStringToObject(m, "role", "assistant");
			oai_add_text(m, "content", ch->text ? ch->text : "");
		} else {
			oai_add_text(c, "text", ch->text ? ch->text : "");
		}
		add_choice_logprobs(c, chat, ch);
		cJSON_AddStringToObject(c, "finish_reason",
					ch->finish_reason ? ch->finish_reason : "stop");
	}
	add_usage(o, u);
	return print(o);
}

char *oai_response_json(int chat, const char *id, const char *model, int64_t created,
			const char *text, const char *finish_reason, const struct oai_usage *u)
{
	struct oai_choice c = {.text = text, .finish_reason = finish_reason};
	return oai_response_choices_json(chat, id, model, created, &c, 1, u);
}

char *oai_chunk_choice_json(int chat, const char *id, const char *model, int64_t created,
			    const struct oai_choice *ch, const struct oai_usage *u)
{
	cJSON *o = head(chat, 1, id, model, created);
	cJSON *arr = cJSON_AddArrayToObject(o, "choices");
	if (ch && (ch->text || ch->finish_reason)) {
		cJSON *c = cJSON_CreateObject();
		cJSON_AddItemToArray(arr, c);
		cJSON_AddNumberToObject(c, "index", ch->index);
		if (chat) {
			cJSON *d = cJSON_AddObjectToObject(c, "delta");
			if (ch->text)
				oai_add_text(d, "content", ch->text);
		} else {
			oai_add_text(c, "text", ch->text ? ch->text : "");
		}
		if (ch->has_lp)
			add_choice_logprobs(c, chat, ch);
		if (ch->finish_reason)
			cJSON_AddStringToObject(c, "finish_reason", ch->finish_reason);
		else
			cJSON_AddNullToObject(c, "finish_reason");
	}
	if (u)
		add_usage(o, u);
	return print(o);
}

char *oai_chunk_json(int chat, const char *id, const char *model, int64_t created, const char *text,
		     const char *finish_reason, const struct oai_usage *u)
{
	struct oai_choice c = {.text = text, .finish_reason = finish_reason};
	return oai_chunk_choice_json(chat, id, model, created, &c, u);
}

char *oai_chunk_role_json(const char *id, const char *model, int64_t created, int index)
{
	cJSON *o = head(1, 1, id, model, created);
	cJSON *ch = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
	cJSON_AddItemToArray(ch, c);
	cJSON_AddNumberToObject(c, "index", index);
	cJSON *d = cJSON_AddObjectToObject(c, "delta");
	cJSON_AddStringToObject(d, "role", "assistant");
	cJSON_AddStringToObject(d, "content", "");
	cJSON_AddNullToObject(c, "finish_reason");
	return print(o);
}

static cJSON *model_obj(const char *id, int64_t created)
{
	cJSON *m = cJSON_CreateObject();
	cJSON_AddStringToObject(m, "id", id);
	cJSON_AddStringToObject(m, "object", "model");
	cJSON_AddNumberToObject(m, "created", (double)created);
	cJSON_AddStringToObject(m, "owned_by", "kvfs");
	return m;
}

char *oai_models_json(const char *const *ids, int n, int64_t created)
{
	cJSON *o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "object", "list");
	cJSON *d = cJSON_AddArrayToObject(o, "data");
	for (int i = 0; i < n; i++)
		cJSON_AddItemToArray(d, model_obj(ids[i], created));
	return print(o);
}

char *oai_model_json(const char *id, int64_t created)
{
	return print(model_obj(id, created));
}
