-- wrk script: POST one append per request to wrk's URL path, each with fresh uuids.
-- Environment: LOAD_BATCH (messages per append, default 1), LOAD_RUN (a run id for the uuids).
local batch = tonumber(os.getenv("LOAD_BATCH") or "1")
local run = os.getenv("LOAD_RUN") or "run"
local text = string.rep("let me look at the file and then run the build again. ", 8)
local threads = {}
local counter = 0

function setup(thread)
  table.insert(threads, thread)
  thread:set("tid", #threads)
end

function request()
  local parts = {}
  for _ = 1, batch do
    counter = counter + 1
    parts[#parts + 1] = string.format(
      '{"uuid":"%s-%d-%d","type":"user","message":{"role":"user","content":"%s"}}',
      run, tid, counter, text)
  end
  local body = '{"messages":[' .. table.concat(parts, ",") .. ']}'
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, body)
end
