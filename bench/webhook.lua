-- POST /webhooks/stripe with pre-signed deliveries (unique event ids), read from
-- $BENCH_DELIVERIES.<thread> ("<Stripe-Signature>\t<body>" per line) and formatted once in init,
-- so wrk spends nothing per request. A thread that runs out starts over (bench/webhook.py sizes
-- the files so that does not happen and reports it if it does).
local requests = {}
local count = 0
local i = 0
local threads = {}

function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end

function init(args)
  local path = os.getenv("BENCH_DELIVERIES") .. "." .. tostring(tid)
  for line in io.lines(path) do
    local tab = line:find("\t", 1, true)
    count = count + 1
    requests[count] = wrk.format("POST", "/webhooks/stripe", {
      ["Content-Type"] = "application/json; charset=utf-8",
      ["User-Agent"] = "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
      ["Stripe-Signature"] = line:sub(1, tab - 1),
    }, line:sub(tab + 1))
  end
end

request = function()
  i = i + 1
  if i > count then i = 1 end
  return requests[i]
end
