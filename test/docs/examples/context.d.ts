// What the examples of integrations/node/README.md leave to their reader, typed as
// a real application's would be (test/docs/package_examples.py compiles each
// example with this file and tsc --strict).  Only names the README does not define:
// never the package's own, so what is checked is the README's code as written.
import type { Express, NextFunction, Request, RequestHandler, Response } from 'express';
import type { Pool } from 'pg';
import type { PoolClientLike } from 'idempotency-pg';

interface OrderMessage {
  messageId: string;
  attributes: { dedupId: string };
  queue: string;
  body: { orderId: string; amount: number };
}

declare global {
  // the application's own: authentication put a user on the request, validation answers 400s
  namespace Express {
    interface Request {
      user: { clientId: string };
    }
  }
  function validate(req: Request, res: Response, next: NextFunction): void;
  // the queue consumer's: the pool, the broker's client and what it offers
  const pool: Pool;
  const consumer: { on(event: 'message', listener: (message: OrderMessage) => Promise<void>): void };
  function ack(message: OrderMessage): void;
  function requeue(message: OrderMessage, options?: { delaySeconds: number }): void;
  function deadLetter(message: OrderMessage): void;
  // "Tenant isolation" repeats the calls of the first examples with their names
  const app: Express;
  const express: typeof import('express');
  const idempotency: typeof import('idempotency-pg').idempotency;
  const idempotent: typeof import('idempotency-pg').idempotent;
  function tenant(req: Request): string;
  const route: RequestHandler;
  function fn(db: PoolClientLike, message: OrderMessage): Promise<unknown>;
}

export {};
