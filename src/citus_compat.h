/*
 * citus_compat.h
 *		Every name and number of Citus's internals that citus.c and
 *		shard_route.c rely on, copied here from Citus's own sources.
 *
 * Read from Citus 13.2.2 and 14.0.1 (the archives in ../shared/vendor, the
 * versions the tests build), where each is the same.  None of it is an
 * interface Citus promises to keep: a new Citus may change any of it
 * without notice.  The Citus suite (test/suites/90-citus, case v) holds each
 * value against the Citus it installed: its headers, the symbols of its
 * library and its catalogs; it fails when one no longer matches, and this
 * file is where to look again.  The shortcut of shard_route.c is taken only
 * for the majors listed here.
 */
#ifndef IDEM_CITUS_COMPAT_H
#define IDEM_CITUS_COMPAT_H

#include "storage/lock.h"

/* the Citus versions this file was read from, and their majors */
#define CITUS_READ_FROM_VERSIONS	"13.2.2, 14.0.1"
#define CITUS_MAJOR_FIRST			13
#define CITUS_MAJOR_LAST			14

/*
 * Columns of Citus's catalogs read with a scan key (pg_dist_partition.h
 * Anum_pg_dist_partition_logicalrelid; metadata/pg_dist_object.h
 * Anum_pg_dist_object_objid).
 */
#define CITUS_DIST_PARTITION_LOGICALRELID	1
#define CITUS_DIST_OBJECT_OBJID				2

/*
 * Citus's library and the functions of it that shard_route.c looks up with
 * load_external_function (local_executor.h).  From PostgreSQL 16 on PGXS
 * hides a module's symbols but for its SQL functions: then they are not
 * found, and shard_route.c goes the other way.
 */
#define CITUS_LIBRARY							"$libdir/citus"
#define CITUS_GET_LOCAL_EXECUTION_STATUS_SYMBOL	"GetCurrentLocalExecutionStatus"
#define CITUS_SET_LOCAL_EXECUTION_STATUS_SYMBOL	"SetLocalExecutionStatus"

/* LocalExecutionStatus (local_executor.h), what those functions take and give */
#define CITUS_LOCAL_EXECUTION_REQUIRED	0
#define CITUS_LOCAL_EXECUTION_OPTIONAL	1
#define CITUS_LOCAL_EXECUTION_DISABLED	2

/*
 * The classes of Citus's advisory locks on a shard's placement metadata
 * (AdvisoryLocktagClass, resource_lock.h): by shard, and by colocation
 * group and shard index.
 */
#define CITUS_LOCKTAG_SHARD_METADATA				4
#define CITUS_LOCKTAG_COLOCATED_SHARDS_METADATA	8

/*
 * Their tags, laid out as Citus lays them out (resource_lock.h,
 * SET_LOCKTAG_SHARD_METADATA_RESOURCE and
 * SET_LOCKTAG_COLOCATED_SHARDS_METADATA_RESOURCE, the same arguments in the
 * same places).
 */
#define CITUS_SET_LOCKTAG_SHARD_METADATA(tag, db, shardid) \
	SET_LOCKTAG_ADVISORY(tag, \
						 db, \
						 (uint32) ((shardid) >> 32), \
						 (uint32) (shardid), \
						 CITUS_LOCKTAG_SHARD_METADATA)

#define CITUS_SET_LOCKTAG_COLOCATED_SHARDS_METADATA(tag, db, colocationId, \
													shardIntervalIndex) \
	SET_LOCKTAG_ADVISORY(tag, \
						 db, \
						 (uint32) shardIntervalIndex, \
						 (uint32) colocationId, \
						 CITUS_LOCKTAG_COLOCATED_SHARDS_METADATA)

#endif							/* IDEM_CITUS_COMPAT_H */
