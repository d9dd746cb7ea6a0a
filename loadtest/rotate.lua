-- wrk script: rotate over the request targets listed in a file (one per line, optionally
-- followed by a tab and a Range header value), each thread from its own offset, and print
-- one JSON line of results for loadtest/wrk.py to read.
--
-- One server:    wrk -s rotate.lua URL -- TARGETS_FILE
-- Several nodes: LT_WRK_HOSTS=host1:port1,host2:port2 wrk -s rotate.lua URL -- FILE1 FILE2
--   thread i connects to node i % N (wrk.lookup, set as thread.addr in setup()), sends that
--   node's Host header (SigV4 signs it) and rotates over that node's own file (the i % N + 1st
--   argument). wrk merges every thread's latencies, so p50/p99 are of all the nodes together.
--   setup() runs in wrk's main Lua state, which never sees the script's arguments: hence the
--   environment variable. URL only names the first node's scheme and default Host.

local hosts = {}
for hostport in string.gmatch(os.getenv("LT_WRK_HOSTS") or "", "[^,%s]+") do
  hosts[#hosts + 1] = hostport
end
local nodes = math.max(#hosts, 1)

local requests = {}
local counter = 0
local next_id = 0

function setup(thread)
  local index = next_id % nodes
  if #hosts > 0 then
    local hostport = hosts[index + 1]
    local host, port = hostport:match("^%[(.+)%]:(%d+)$") -- [v6]:port
    if not host then
      host, port = hostport:match("^(.+):(%d+)$")
    end
    assert(host, "LT_WRK_HOSTS: want host:port, got " .. hostport)
    local addrs = wrk.lookup(host, port)
    assert(addrs and #addrs > 0, "cannot resolve " .. hostport)
    thread.addr = addrs[1]
  end
  thread:set("id", next_id)
  thread:set("node", index)
  next_id = next_id + 1
end

function init(args)
  -- Every request is formatted once here, not once per request.
  local file = args[(node or 0) + 1]
  assert(file, "no targets file for node " .. (node or 0))
  local host = hosts[(node or 0) + 1] -- nil: wrk's own Host, from URL
  for line in io.lines(file) do
    local target, range = line:match("^([^\t]+)\t(.+)$")
    if target then
      requests[#requests + 1] = wrk.format("GET", target, { Host = host, Range = range })
    elseif host then
      requests[#requests + 1] = wrk.format("GET", line, { Host = host })
    else
      requests[#requests + 1] = wrk.format("GET", line)
    end
  end
  -- Threads on one node start at different places so that they do not ask for the same
  -- object together.
  counter = math.floor((id or 0) / nodes) * math.floor(#requests / 2 + 1)
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
