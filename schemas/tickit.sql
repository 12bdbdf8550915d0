-- TICKIT sample schema for the CDC source (REFERENCE.md section 7), idempotent: safe to run again.
-- The public Redshift TICKIT sample declares no primary keys; Debezium needs them for message keys, so every
-- table has one. TICKIT's three systems are schemas of one database: ecomm (date, listing, sales),
-- ems (category, event, venue), crm (users). No foreign keys, as in TICKIT.

CREATE SCHEMA IF NOT EXISTS ecomm;
CREATE SCHEMA IF NOT EXISTS ems;
CREATE SCHEMA IF NOT EXISTS crm;

CREATE TABLE IF NOT EXISTS crm.users (
  userid integer PRIMARY KEY, username char(8), firstname varchar(30), lastname varchar(30),
  city varchar(30), state char(2), email varchar(100), phone char(14), likesports boolean, liketheatre boolean,
  likeconcerts boolean, likejazz boolean, likeclassical boolean, likeopera boolean, likerock boolean,
  likevegas boolean, likebroadway boolean, likemusicals boolean);

CREATE TABLE IF NOT EXISTS ems.venue (
  venueid smallint PRIMARY KEY, venuename varchar(100), venuecity varchar(30),
  venuestate char(2), venueseats integer);

CREATE TABLE IF NOT EXISTS ems.category (
  catid smallint PRIMARY KEY, catgroup varchar(10), catname varchar(10), catdesc varchar(50));

CREATE TABLE IF NOT EXISTS ecomm.date (
  dateid smallint PRIMARY KEY, caldate date NOT NULL, day char(3) NOT NULL, week smallint NOT NULL,
  month char(5) NOT NULL, qtr char(5) NOT NULL, year smallint NOT NULL, holiday boolean DEFAULT false);

CREATE TABLE IF NOT EXISTS ems.event (
  eventid integer PRIMARY KEY, venueid smallint NOT NULL, catid smallint NOT NULL,
  dateid smallint NOT NULL, eventname varchar(200), starttime timestamp);

CREATE TABLE IF NOT EXISTS ecomm.listing (
  listid integer PRIMARY KEY, sellerid integer NOT NULL, eventid integer NOT NULL,
  dateid smallint NOT NULL, numtickets smallint NOT NULL, priceperticket decimal(8,2), totalprice decimal(8,2),
  listtime timestamp);

CREATE TABLE IF NOT EXISTS ecomm.sales (
  salesid integer PRIMARY KEY, listid integer NOT NULL, sellerid integer NOT NULL,
  buyerid integer NOT NULL, eventid integer NOT NULL, dateid smallint NOT NULL, qtysold smallint NOT NULL,
  pricepaid decimal(8,2), commission decimal(8,2), saletime timestamp);

-- REPLICA IDENTITY FULL: with the default identity (the primary key) PostgreSQL writes only the key columns of
-- the old row to the WAL, so Debezium's delete events (and the "before" of updates) would carry nulls for every
-- other column. FULL logs the whole old row, so a delete event carries the complete before image.
-- Re-running ALTER ... REPLICA IDENTITY FULL on a table that already has it is a no-op.
ALTER TABLE crm.users REPLICA IDENTITY FULL;
ALTER TABLE ems.venue REPLICA IDENTITY FULL;
ALTER TABLE ems.category REPLICA IDENTITY FULL;
ALTER TABLE ecomm.date REPLICA IDENTITY FULL;
ALTER TABLE ems.event REPLICA IDENTITY FULL;
ALTER TABLE ecomm.listing REPLICA IDENTITY FULL;
ALTER TABLE ecomm.sales REPLICA IDENTITY FULL;
