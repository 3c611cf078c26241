'use strict';
/*
 * The key and the fingerprint of a message, from an expression over it: the
 * same rules and the same error texts as the Python package's field paths
 * (idempotency_pg/core.py: parse_path, lookup, payload_fingerprint), so a
 * record one package wrote replays in the other with the same options.
 *
 *   a field path  'body.order.id', 'Records[0].messageId', 'items[-1]',
 *                 'headers["x-request.id"]': a small subset of JMESPath, enough
 *                 to point at one value; no dependency
 *   JMESPath      eventKeyJmesPath, payloadValidationJmesPath: the whole
 *                 language over the message's JSON (the jmespath package, an
 *                 optional peer dependency, loaded only when one is given)
 */
const { canonicalJson, sha256 } = require('./common');

const MISSING = Symbol('missing');
// The steps of a field path, as Python's re matches them: a name (anything but . [ ]), a list
// index ([3], [-1]; any decimal digits, as Python's \d and int()), a quoted name (["a.b"], ['a.b'];
// not across a newline, as Python's "."), a dot.
const SEGMENT = /(?<name>[^.[\]]+)|\[(?<index>-?\p{Nd}+)\]|\[(?<quote>["'])(?<quoted>[^\n]*?)\k<quote>\]|(?<dot>\.)/uy;
// what Python's str.strip() removes (str.isspace()), which String.prototype.trim() does not quite
const PY_SPACE = '[\\t\\n\\v\\f\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]';
const STRIP = new RegExp(`^${PY_SPACE}+|${PY_SPACE}+$`, 'g');
const pyStrip = (text) => text.replace(STRIP, '');
// a character position as Python counts it (code points, from 1)
const position = (path, index) => [...path.slice(0, index)].length + 1;
const ND = /\p{Nd}/u;

/** The value of a decimal digit of any script: Unicode's decimal digits come in runs of ten, 0 to 9. */
function digitValue(ch) {
  const code = ch.codePointAt(0);
  let start = code;
  while (ND.test(String.fromCodePoint(start - 1))) start -= 1;
  return (code - start) % 10;
}

/** 'body.order.id', 'records[0].messageId', 'headers["x-request.id"]' into its steps: names
 *  (strings) and indexes (numbers). Throws a TypeError with Python's text for a bad path. */
function parsePath(path) {
  if (typeof path !== 'string' || pyStrip(path) === '') throw new TypeError('A field path must be a non-empty string.');
  const steps = [];
  let pos = 0;
  let expectName = true;
  while (pos < path.length) {
    SEGMENT.lastIndex = pos;
    const m = SEGMENT.exec(path);
    if (!m) throw new TypeError(`The field path "${path}" is invalid at character ${position(path, pos)}.`);
    const { name, index, quoted, dot } = m.groups;
    if (dot !== undefined) {
      if (expectName) throw new TypeError(`The field path "${path}" has an empty field name at character ${position(path, pos)}.`);
      expectName = true;
    } else if (name !== undefined) {
      if (!expectName) throw new TypeError(`The field path "${path}" needs a "." before character ${position(path, pos)}.`);
      steps.push(pyStrip(name));
      expectName = false;
    } else if (index !== undefined) {
      const digits = [...index.replace('-', '')].reduce((n, ch) => n * 10 + digitValue(ch), 0);
      steps.push(index.startsWith('-') ? -digits || 0 : digits);   // not -0
      expectName = false;
    } else {
      steps.push(quoted);
      expectName = false;
    }
    pos = SEGMENT.lastIndex;
  }
  if (expectName) throw new TypeError(`The field path "${path}" ends with ".".`);
  return steps;
}

const isPlainObject = (value) => {
  const proto = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
};

/** The value at steps in a message, or MISSING: arrays by index (negative from the end), a Map
 *  by key, a plain object by its own keys, any other object by its properties. */
function lookup(message, steps) {
  let value = message;
  for (const step of steps) {
    if (typeof step === 'number') {
      if (!Array.isArray(value)) return MISSING;
      const i = step < 0 ? value.length + step : step;
      if (i < 0 || i >= value.length) return MISSING;
      value = value[i];
    } else if (value instanceof Map) {
      if (!value.has(step)) return MISSING;
      value = value.get(step);
    } else if (value !== null && typeof value === 'object' && !Array.isArray(value)
               && (Object.hasOwn(value, step) || (!isPlainObject(value) && step in value))) {
      value = value[step];
    } else {
      return MISSING;
    }
    if (value === undefined) return MISSING;
  }
  return value;
}

/** A function of the message from a field path or a function; a missing field gives undefined. */
function valueGetter(spec) {
  if (typeof spec === 'function') return spec;
  const steps = parsePath(spec);
  return (message) => {
    const value = lookup(message, steps);
    return value === MISSING ? undefined : value;
  };
}

const digest = (value) => `sha256:${sha256(canonicalJson(value))}`;

/**
 * The fingerprint function of the payloadValidation option, or null:
 *   null        no fingerprint (the key alone decides; nothing is compared)
 *   '*'         the whole message
 *   a path      that field
 *   paths       those fields ({path: value}; a missing one counts as null)
 *   a function  what it returns
 * each as 'sha256:' and the SHA-256 of its canonical JSON, as the Python package makes it.
 */
function payloadFingerprint(spec) {
  if (spec === null || spec === undefined) return null;
  if (typeof spec === 'function') return (message) => digest(spec(message) ?? null);
  if (spec === '*') return (message) => digest(message ?? null);
  if (typeof spec !== 'string' && (spec === null || typeof spec[Symbol.iterator] !== 'function')) {
    throw new TypeError("The payloadValidation option must be '*', a field path, an array of field paths or a function"
      + ' of the message.');
  }
  const paths = typeof spec === 'string' ? [spec] : [...spec];
  if (paths.length === 0) throw new TypeError('payloadValidation needs at least one field path.');
  const parsed = paths.map((path) => [path, parsePath(path)]);
  return (message) => {
    const fields = Object.create(null);
    for (const [path, steps] of parsed) {
      const value = lookup(message, steps);
      fields[path] = value === MISSING ? null : value;
    }
    return digest(fields);
  };
}

/** A function of the message from a JMESPath expression, checked now; the message is read as its
 *  JSON. Without the jmespath package: an Error with code MODULE_NOT_FOUND, as require's. */
function jmesPath(expression, name) {
  let jmespath;
  try {
    jmespath = require('jmespath');  // eslint-disable-line global-require
  } catch (e) {
    if (e.code !== 'MODULE_NOT_FOUND') throw e;
    const error = new Error(`${name} needs the jmespath package (npm install jmespath);`
      + ' a field path (key, payloadValidation) needs nothing.');
    error.code = 'MODULE_NOT_FOUND';
    throw error;
  }
  if (typeof expression !== 'string' || pyStrip(expression) === '') {
    throw new TypeError(`${name} must be a JMESPath expression.`);
  }
  jmespath.compile(expression);      // a syntax error is thrown now, not on the first message
  return (message) => jmespath.search(JSON.parse(JSON.stringify(message ?? null)), expression);
}

module.exports = { MISSING, parsePath, lookup, valueGetter, payloadFingerprint, jmesPath };
