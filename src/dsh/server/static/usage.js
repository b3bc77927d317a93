// Token and cost totals as the API carries them: on a session summary (`tokens`: the counts with
// `cost` and `currency` for a priced model) and in the projections of a history tail page. Counts follow the harness's disjoint TokenUsage shape
// (`inputTokens` is uncached input; `cacheReadTokens`, `cacheWriteTokens`, `outputTokens` and
// `reasoningTokens` beside it). Any field may be absent: a model without a price has no cost.

const USAGE_KEYS = ["tokens", "usage", "tokenUsage", "sessionUsage"];
const COUNT_KEYS = ["inputTokens", "cacheReadTokens", "cacheWriteTokens", "outputTokens"];

function count(value) {
  return typeof value === "number" && Number.isFinite(value) && value >= 0 ? value : 0;
}

function costOf(holder, usage) {
  const currency = [holder.currency, usage && usage.currency].find((value) => typeof value === "string" && value) || "USD";
  for (const candidate of [holder.cost, usage && usage.cost]) {
    if (typeof candidate === "number" && Number.isFinite(candidate)) return { cost: candidate, currency };
    if (candidate && typeof candidate === "object") {
      const amount = candidate.amount ?? candidate.total ?? candidate.usd;
      if (typeof amount === "number" && Number.isFinite(amount)) {
        return { cost: amount, currency: typeof candidate.currency === "string" ? candidate.currency : "USD" };
      }
    }
  }
  for (const candidate of [holder.costUsd, usage && usage.costUsd]) {
    if (typeof candidate === "number" && Number.isFinite(candidate)) return { cost: candidate, currency: "USD" };
  }
  return null;
}

/**
 * `{tokens, detail, cost?, currency?}` from a summary or a projection block, or null when it
 * carries no usage. `tokens` counts input (cached and uncached) plus output.
 */
export function usageTotals(holder) {
  if (!holder || typeof holder !== "object") return null;
  let usage = null;
  for (const key of USAGE_KEYS) {
    const value = holder[key];
    if (value && typeof value === "object") {
      usage = value.total && typeof value.total === "object" ? value.total : value;
      break;
    }
  }
  if (!usage || !COUNT_KEYS.some((key) => typeof usage[key] === "number")) return null;
  const tokens = COUNT_KEYS.reduce((sum, key) => sum + count(usage[key]), 0);
  const detail = [
    `input ${count(usage.inputTokens)}`,
    `cached ${count(usage.cacheReadTokens)}`,
    `output ${count(usage.outputTokens)}`,
  ].join(" · ");
  const out = { tokens, detail };
  const cost = costOf(holder, usage);
  if (cost) Object.assign(out, cost);
  return out;
}

/**
 * New totals over held ones: a projection's totals carry no cost (the server prices only summaries),
 * so a held cost stays while the token count is the same; once the count moved it is dropped until
 * the next summary brings the new one.
 */
export function mergeTotals(held, fresh) {
  if (!fresh) return held;
  if (held && typeof held.cost === "number" && typeof fresh.cost !== "number" && held.tokens === fresh.tokens) {
    return { ...fresh, cost: held.cost, currency: held.currency };
  }
  return fresh;
}
