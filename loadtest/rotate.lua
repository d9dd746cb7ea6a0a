-- wrk script: rotate over the request targets listed in a file (one per line), each thread
-- from its own offset, and print one JSON line of results for loadtest/wrk.py to read.
-- Usage: wrk -s rotate.lua URL -- TARGETS_FILE

local targets = {}
local counter = 0
local next_id = 0

function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
end

function init(args)
  for line in io.lines(args[1]) do
    targets[#targets + 1] = line
  end
  -- Threads start at different places so that they do not ask for the same object together.
  counter = (id or 0) * math.floor(#targets / 2 + 1)
end

function request()
  counter = counter + 1
  return wrk.format("GET", targets[(counter % #targets) + 1])
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\nLOADTEST {"requests":%d,"bytes":%d,"duration_us":%d,"connect":%d,"read":%d,' ..
    '"write":%d,"status":%d,"timeout":%d,"p50_us":%d,"p99_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.bytes, summary.duration, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(99), latency.mean))
end
