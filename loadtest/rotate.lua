-- wrk script: rotate over the request targets listed in a file (one per line, optionally
-- followed by a tab and a Range header value), each thread from its own offset, and print
-- one JSON line of results for loadtest/wrk.py to read.
-- Usage: wrk -s rotate.lua URL -- TARGETS_FILE

local requests = {}
local counter = 0
local next_id = 0

function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
end

function init(args)
  -- Every request is formatted once here, not once per request.
  for line in io.lines(args[1]) do
    local target, range = line:match("^([^\t]+)\t(.+)$")
    if target then
      requests[#requests + 1] = wrk.format("GET", target, { Range = range })
    else
      requests[#requests + 1] = wrk.format("GET", line)
    end
  end
  -- Threads start at different places so that they do not ask for the same object together.
  counter = (id or 0) * math.floor(#requests / 2 + 1)
end

function request()
  counter = counter + 1
  return requests[(counter % #requests) + 1]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\nLOADTEST {"requests":%d,"bytes":%d,"duration_us":%d,"connect":%d,"read":%d,' ..
    '"write":%d,"status":%d,"timeout":%d,"p50_us":%d,"p99_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.bytes, summary.duration, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(99), latency.mean))
end
