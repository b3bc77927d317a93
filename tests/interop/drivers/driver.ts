// The interop suite's driver: runs the TypeScript harness's own session code on request.
//
// It is copied into a temporary copy of the pinned harness sources (`<copy>/interop/driver.ts`), so
// the tsconfig `paths` of that copy resolve the `@deepseek-ai/*` imports, and runs under Node 22 with
// tsx. It reads one JSON request per line on stdin and answers each with one line on stdout that
// starts with `@@interop ` (anything else the harness prints is a log line, not an answer):
//
//   {"id": 7, "op": "inspect", "root": "/tmp/x/sessions", "compression": "zstd", "session": "s1"}
//   @@interop {"id": 7, "ok": true, "result": {"meta": {...}, "events": [...]}}
//   @@interop {"id": 8, "ok": false, "error": {"name": "SessionPersistenceCorruptionError", "message": "..."}}
//
// Every request gets a fresh context (session store, projection registry with the subagent units,
// JSONL persistence over `root`), so nothing a request did is remembered by the next one except
// what it wrote to disk. The operations are listed in `OPERATIONS` below; docs/storage-format.md
// describes what the Python side checks with them.

import { createInterface } from 'node:readline'
import { Context } from '@deepseek-ai/cordis'
import SessionStore from '@deepseek-ai/dsh-session'
import type { Session, SessionEvent, SessionId } from '@deepseek-ai/dsh-session'
import { SessionProjectionRegistry } from '@deepseek-ai/dsh-session-projection'
import JsonlSessionPersistence from '@deepseek-ai/dsh-session-persistence-jsonl'
import type { SessionPersistence } from '@deepseek-ai/dsh-session-persistence'
import {
  subagentIdentityProjectionDefinition,
  subagentTimingProjectionDefinition,
} from '../packages/subagent/subagent/src/projection.ts'
import { listChildren, listDescendants } from '../packages/subagent/subagent/src/list-children.ts'

type Json = null | boolean | number | string | Json[] | { [key: string]: Json }
type Request = { [key: string]: Json }

/** One event to append: its type, its data and (for surface types) its surface metadata. */
interface Append {
  type: string
  data: Json
  surfaceOp?: Json
  sourceEventSeqs?: number[]
}

interface Harness {
  ctx: Context
  sessions: SessionStore
  persistence: SessionPersistence
}

const ANSWER = '@@interop '

function field<T extends Json>(request: Request, name: string): T {
  const value = request[name]
  if (value === undefined) throw new Error(`request has no "${name}"`)
  return value as T
}

/** A fresh context over one JSONL root: the same plugins the harness mounts to read and list sessions. */
async function open(request: Request): Promise<Harness> {
  const ctx = new Context()
  await ctx.plugin(SessionStore)
  await ctx.plugin(SessionProjectionRegistry)
  await ctx.plugin(JsonlSessionPersistence, {
    root: field<string>(request, 'root'),
    compression: (request.compression ?? 'zstd') as 'zstd' | 'none',
    packChunks: (request.packChunks ?? true) as boolean,
    // The shortest batching window: a flush is what the tests wait for, never a timer.
    writeBatchMaxDelayMs: 1,
  })
  ctx.sessionProjections.register(subagentTimingProjectionDefinition)
  ctx.sessionProjections.register(subagentIdentityProjectionDefinition)
  const sessions = ctx.get('sessions')
  const persistence = ctx.get('sessionPersistence')
  if (sessions === undefined || persistence === undefined) throw new Error('the harness services did not start')
  return { ctx, sessions, persistence }
}

/** Append the batches to a live session, flushing after each one (one flush = one durable batch). */
async function appendBatches(harness: Harness, session: Session, batches: Append[][]): Promise<void> {
  for (const batch of batches) {
    for (const item of batch) {
      const opts: { surfaceOp?: Json; sourceEventSeqs?: number[] } = {}
      if (item.surfaceOp !== undefined) opts.surfaceOp = item.surfaceOp
      if (item.sourceEventSeqs !== undefined) opts.sourceEventSeqs = item.sourceEventSeqs
      // The driver appends whatever the test asks for; the harness's own checks decide.
      ;(session.append as (type: string, data: Json, opts?: object) => SessionEvent)(
        item.type,
        item.data,
        ...(item.surfaceOp === undefined ? [] : [opts]),
      )
    }
    await harness.sessions.flush(session)
  }
}

/** Resume a stored session the way the harness does: prepare it from persistence, then publish it. */
async function resume(harness: Harness, id: SessionId): Promise<Session> {
  const preparation = await harness.persistence.prepare(id)
  const session = preparation.session
  harness.sessions.enter(session)
  harness.sessions.announce(session)
  preparation[Symbol.dispose]()
  return session
}

function inspection(result: { meta: unknown; events: readonly unknown[] }): Json {
  return { meta: result.meta as Json, events: result.events as Json }
}

const OPERATIONS: Record<string, (harness: Harness, request: Request) => Promise<Json>> = {
  /** `persistence.list()`: the stored headers. */
  list: async harness => (await harness.persistence.list()) as unknown as Json,
  /** `persistence.listSnapshots()`: each stored header with the harness's revision token. */
  snapshots: async harness => (await harness.persistence.listSnapshots()) as unknown as Json,
  /** `persistence.inspect(id)`: the balanced logical log, nothing written. */
  inspect: async (harness, request) =>
    inspection(await harness.persistence.inspect(field<string>(request, 'session') as SessionId)),
  /** `persistence.load(id)`: the balanced log, with the torn tail cut and closers appended on disk. */
  load: async (harness, request) =>
    inspection(await harness.persistence.load(field<string>(request, 'session') as SessionId)),
  /** `listChildren(ctx, parent)` for every parent asked (each answer or its error). */
  children: async (harness, request) => {
    const out: { [parent: string]: Json } = {}
    for (const parent of field<string[]>(request, 'parents')) {
      try {
        out[parent] = { ok: true, rows: (await listChildren(harness.ctx, parent as SessionId)) as unknown as Json }
      } catch (error) {
        out[parent] = { ok: false, error: describe(error) }
      }
    }
    return out
  },
  /** `listDescendants(ctx, root)`. */
  descendants: async (harness, request) =>
    (await listDescendants(harness.ctx, field<string>(request, 'session') as SessionId)) as unknown as Json,
  /** Create sessions through the live append path: `sessions.create(id, {meta})`, then the batches. */
  write: async (harness, request) => {
    for (const spec of field<Request[]>(request, 'sessions')) {
      const meta = (spec.meta ?? {}) as Record<string, Json>
      const session = harness.sessions.create(field<string>(spec, 'id') as SessionId, { meta: meta as never })
      await appendBatches(harness, session, (spec.batches ?? []) as unknown as Append[][])
    }
    return null
  },
  /**
   * Resume a stored session and answer its model-visible surface: the current node seqs, each node's
   * event type and the source of each `user/message` node (a compaction's checkpoint is one of them).
   */
  surface: async (harness, request) => {
    const session = await resume(harness, field<string>(request, 'session') as SessionId)
    const nodes = [...session.surface.nodes]
    const kinds = nodes.map(seq => session.events[seq]?.type ?? null)
    const sources = nodes.map(seq => {
      const event = session.events[seq]
      return event?.type === 'user/message' ? ((event.data as { source?: unknown }).source ?? null) : null
    })
    return { nodes, kinds, sources } as unknown as Json
  },
  /** Resume a stored session (prepare, which repairs a crash tail), append the batches, flush. */
  resume: async (harness, request) => {
    const session = await resume(harness, field<string>(request, 'session') as SessionId)
    await appendBatches(harness, session, (request.batches ?? []) as unknown as Append[][])
    return { seq: session.seq }
  },
  /**
   * Resume `source`, fork it through `boundary` (or its end) as `child`, append the child's batches.
   * Without `meta` this is `sessions.fork`; with it, the child is created from the same prefix with
   * that lineage added (`origin`, `delegationDepth`, ...), as a subagent provider forks a child.
   */
  fork: async (harness, request) => {
    const source = await resume(harness, field<string>(request, 'source') as SessionId)
    const boundary = request.boundary === undefined || request.boundary === null ? undefined : (request.boundary as number)
    const childId = field<string>(request, 'child') as SessionId
    let child: Session
    if (request.meta === undefined) {
      child = harness.sessions.fork(source, boundary, childId)
    } else {
      const seed = source.events.slice(0, (boundary ?? source.events.length - 1) + 1)
      const meta = {
        ...(source.header.cwd === undefined ? {} : { cwd: source.header.cwd }),
        ...(request.meta as Record<string, Json>),
        parentSession: source.id,
        seedLength: seed.length,
      }
      child = harness.sessions.create(childId, { seed, meta: meta as never })
    }
    await appendBatches(harness, child, (request.batches ?? []) as unknown as Append[][])
    return { header: child.header as unknown as Json, seq: child.seq }
  },
}

function describe(error: unknown): Json {
  if (error instanceof Error) {
    const cause = error.cause instanceof Error ? `${error.cause.name}: ${error.cause.message}` : null
    return { name: error.name, message: error.message, cause, code: ((error as { code?: unknown }).code ?? null) as Json }
  }
  return { name: 'thrown', message: String(error), cause: null, code: null }
}

async function answer(line: string): Promise<string> {
  let id: Json = null
  try {
    const request = JSON.parse(line) as Request
    id = request.id ?? null
    const operation = OPERATIONS[field<string>(request, 'op')]
    if (operation === undefined) throw new Error(`unknown operation ${JSON.stringify(request.op)}`)
    // Each request's context is simply dropped afterwards: everything it wrote was flushed.
    const harness = await open(request)
    return JSON.stringify({ id, ok: true, result: await operation(harness, request) })
  } catch (error) {
    return JSON.stringify({ id, ok: false, error: describe(error) })
  }
}

const input = createInterface({ input: process.stdin, crlfDelay: Infinity })
for await (const line of input) {
  if (line.trim() === '') continue
  process.stdout.write(`${ANSWER}${await answer(line)}\n`)
}
process.exit(0)
