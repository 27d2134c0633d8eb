-- wrk script: POST appends spread round-robin over LOAD_THREAD_COUNT threads named
-- <LOAD_RUN>-t<i>, each append LOAD_BATCH messages of about 300 bytes with fresh uuids.
local batch = tonumber(os.getenv("LOAD_BATCH") or "2")
local count = tonumber(os.getenv("LOAD_THREAD_COUNT") or "100")
local run = os.getenv("LOAD_RUN") or "run"
local text = string.rep("the append handler checks the index first. ", 6)
local threads = {}
local counter = 0

function setup(thread)
  table.insert(threads, thread)
  thread:set("tid", #threads)
end

function request()
  counter = counter + 1
  local parts = {}
  for i = 1, batch do
    parts[#parts + 1] = string.format(
      '{"uuid":"%s-%d-%d-%d","type":"user","message":{"role":"user","content":"%s"}}',
      run, tid, counter, i, text)
  end
  local path = string.format("/v1/threads/%s-t%d/messages", run, (counter * 7 + tid) % count)
  local body = '{"messages":[' .. table.concat(parts, ",") .. ']}'
  return wrk.format("POST", path, {["Content-Type"] = "application/json"}, body)
end
