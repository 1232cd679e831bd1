-- POST /api/v1/track/sale with a transaction id unique across threads and runs.
local counter = 0
local prefix = ""
local threads = {}
local key = os.getenv("BENCH_API_KEY") or "none"

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  prefix = (os.getenv("BENCH_RUN") or "r") .. "_" .. tostring(tid) .. "_"
end

request = function()
  counter = counter + 1
  local body = '{"transaction_id":"in_' .. prefix .. counter .. '","customer_external_id":"cust_'
    .. (counter % 5000) .. '","amount":' .. (1000 + counter % 900) .. ',"currency":"usd"}'
  return wrk.format("POST", "/api/v1/track/sale",
    {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. key}, body)
end
